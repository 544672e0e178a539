package dev.streamsched.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.apicurio.registry.serde.Legacy4ByteIdHandler;
import io.apicurio.registry.serde.SerdeConfig;
import io.apicurio.registry.serde.avro.AvroKafkaSerializer;
import io.apicurio.registry.serde.strategy.TopicIdStrategy;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

/**
 * Produces transitions in the Confluent Schema Registry wire format instead of the streamsched
 * envelope: the record value is byte 0, the writer schema's 4-byte big-endian id in the registry,
 * then the Avro binary body. Written by Apicurio Registry's own Avro serializer (GenericRecord),
 * which registers the schema under the subject {@code <topic>-value} on first use.
 *
 * <pre>
 *   produce --bootstrap HOST:PORT --registry URL --topic TOPIC --file EVENTS.json [--evolved] [--config FILE]
 * </pre>
 *
 * {@code --registry} is Apicurio Registry's v2 API (e.g. http://localhost:8080/apis/registry/v2),
 * the one this serializer speaks; its id is the one the registry's Confluent-compatible API
 * (/apis/ccompat/v7/schemas/ids/ID) answers with the schema. {@code --evolved} writes with the
 * transition schema plus one optional field appended, {@code trace_id} (a newer producer: a
 * reader on the old schema skips it). The events file and the output lines are those of
 * {@link TransitionProducer}'s {@code produce} (an evolved event may carry {@code trace_id};
 * without one it is {@code "trace-" + event_id}); the key and the partition are the contract's.
 */
public final class RegistryTransitionProducer {

    /** Where the evolved schema differs from the transition schema: one field, appended. */
    static final String TRACE_ID = "trace_id";

    static final Schema EVOLVED = evolved(TransitionProducer.SCHEMA);

    /** The transition schema with the optional {@code trace_id} field (default null) appended. */
    static Schema evolved(Schema base) {
        try {
            ObjectNode doc = (ObjectNode) TransitionProducer.JSON.readTree(base.toString());
            ObjectNode field = ((ArrayNode) doc.get("fields")).addObject();
            field.put("name", TRACE_ID);
            field.putArray("type").add("null").add("string");
            field.putNull("default");
            field.put("doc", "Added by a newer producer: readers on the older schema skip it.");
            return new Schema.Parser().parse(doc.toString());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /**
     * The serializer's settings for the Confluent wire format: no headers (the id goes in the
     * value), a 4-byte id (the default handler writes 8), and that id is the content id, which
     * is what the registry's Confluent-compatible API calls a schema id. Subjects follow the topic
     * (TopicIdStrategy: {@code <topic>-value}); the schema is registered on first use.
     */
    public static Map<String, Object> serdeConfig(String registryUrl) {
        return Map.of(
                SerdeConfig.REGISTRY_URL, registryUrl,
                SerdeConfig.AUTO_REGISTER_ARTIFACT, true,
                SerdeConfig.ENABLE_HEADERS, false,
                SerdeConfig.ID_HANDLER, Legacy4ByteIdHandler.class.getName(),
                SerdeConfig.USE_ID, "contentId",
                SerdeConfig.ARTIFACT_RESOLVER_STRATEGY, TopicIdStrategy.class.getName());
    }

    /** The transition as a record of {@code schema} (the transition schema or the evolved one). */
    public static GenericRecord record(TransitionProducer.Transition ev, Schema schema, String traceId) {
        GenericRecord r = TransitionProducer.record(ev, schema);
        if (schema.getField(TRACE_ID) != null) {
            r.put(TRACE_ID, traceId);
        }
        return r;
    }

    public static void main(String[] args) throws Exception {
        System.exit(produce(args));
    }

    static int usage(String problem) {
        System.err.println(problem + "\nusage:\n"
                + "  produce --bootstrap HOST:PORT --registry URL --topic TOPIC --file EVENTS.json [--evolved]"
                + " [--config FILE]");
        return 2;
    }

    static int produce(String[] args) throws Exception {
        if (args.length == 0 || !args[0].equals("produce")) {
            return usage("a mode: produce");
        }
        String bootstrap = null, registry = null, topic = null, file = null, config = null;
        boolean evolved = false;
        for (int i = 1; i < args.length; i++) {
            String flag = args[i];
            if (flag.equals("--evolved")) {
                evolved = true;
                continue;
            }
            if (i + 1 >= args.length) {
                return usage(flag + " needs a value");
            }
            String value = args[++i];
            switch (flag) {
                case "--bootstrap" -> bootstrap = value;
                case "--registry" -> registry = value;
                case "--topic" -> topic = value;
                case "--file" -> file = value;
                case "--config" -> config = value;
                default -> {
                    return usage("unknown option " + flag);
                }
            }
        }
        if (bootstrap == null || registry == null || topic == null || file == null) {
            return usage("give --bootstrap, --registry, --topic and --file");
        }
        JsonNode doc = TransitionProducer.JSON.readTree(new File(file));
        List<TransitionProducer.Named> events = TransitionProducer.readEvents(doc);
        List<String> traceIds = traceIds(doc, events);
        Schema schema = evolved ? EVOLVED : TransitionProducer.SCHEMA;

        // Checked before the first is sent, as by TransitionProducer: all or nothing.
        List<byte[]> keys = new ArrayList<>();
        List<GenericRecord> values = new ArrayList<>();
        for (int i = 0; i < events.size(); i++) {
            TransitionProducer.Named ev = events.get(i);
            try {
                TransitionProducer.check(ev.event());
                keys.add(TransitionProducer.routeKey(ev.event().tenant(), ev.event().target()));
            } catch (TransitionProducer.Refused e) {
                System.err.println("event " + (ev.name() != null ? ev.name() : "#" + i) + " refused: "
                        + e.getMessage() + "; nothing produced");
                return 1;
            }
            values.add(record(ev.event(), schema, traceIds.get(i)));
        }

        // The contract's settings (acks, idempotence, no partitioner.class: the default
        // partitioner puts a keyed record on murmur2(key) % partitions); only the value differs.
        Properties props = TransitionProducer.producerConfig(bootstrap);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, AvroKafkaSerializer.class.getName());
        props.putAll(serdeConfig(registry));
        if (config != null) {
            try (InputStream in = new FileInputStream(config)) {
                Properties extra = new Properties();
                extra.load(in);
                props.putAll(extra);
            }
        }
        try (KafkaProducer<byte[], Object> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < values.size(); i++) {
                sent.add(producer.send(new ProducerRecord<>(topic, keys.get(i), values.get(i))));
            }
            producer.flush();
            for (int i = 0; i < sent.size(); i++) {
                RecordMetadata md = sent.get(i).get();
                ObjectNode line = TransitionProducer.JSON.createObjectNode();
                if (events.get(i).name() != null) {
                    line.put("name", events.get(i).name());
                }
                line.put("event_id", events.get(i).event().eventId());
                line.put("key", new String(keys.get(i), StandardCharsets.US_ASCII));
                line.put("partition", md.partition());
                line.put("offset", md.offset());
                if (evolved) {
                    line.put(TRACE_ID, traceIds.get(i));
                }
                System.out.println(TransitionProducer.JSON.writeValueAsString(line));
            }
        }
        return 0;
    }

    /** Each event's {@code trace_id}: its own if the file gives one, else derived from its id. */
    static List<String> traceIds(JsonNode doc, List<TransitionProducer.Named> events) {
        List<JsonNode> raw = new ArrayList<>();
        if (doc.isObject() && doc.has("valid")) {
            doc.get("valid").forEach(v -> raw.add(v.get("event")));
        } else {
            doc.forEach(raw::add);
        }
        List<String> out = new ArrayList<>();
        for (int i = 0; i < events.size(); i++) {
            JsonNode given = raw.get(i).get(TRACE_ID);
            out.add(given != null && given.isTextual() ? given.textValue()
                    : "trace-" + events.get(i).event().eventId());
        }
        return out;
    }

    private RegistryTransitionProducer() { }
}
