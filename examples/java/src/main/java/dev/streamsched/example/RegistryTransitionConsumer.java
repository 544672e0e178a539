package dev.streamsched.example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Reads a topic of transitions in the Confluent Schema Registry wire format with Apicurio
 * Registry's Avro deserializer (the writer schema fetched by the id in each value) and prints each
 * record as one JSON line: the record's fields by name ({@code payload} as its UTF-8 text, any
 * field a newer schema added as well), then {@code partition}, {@code offset}, {@code key} and
 * {@code schema_id} (the 4-byte id the value carried). A Java service's view of what another
 * producer wrote: the check that both sides agree on the format.
 *
 * <pre>
 *   consume --bootstrap HOST:PORT --registry URL --topic TOPIC --count N [--timeout-ms MS]
 * </pre>
 *
 * Reads from the beginning of every partition (no consumer group, committed records only) until
 * {@code N} records are printed; exits 1 if fewer arrive within the timeout (default 60 s), 3 if
 * a value does not decode.
 */
public final class RegistryTransitionConsumer {

    public static void main(String[] args) throws Exception {
        System.exit(consume(args));
    }

    static int usage(String problem) {
        System.err.println(problem + "\nusage:\n"
                + "  consume --bootstrap HOST:PORT --registry URL --topic TOPIC --count N [--timeout-ms MS]");
        return 2;
    }

    static int consume(String[] args) {
        if (args.length == 0 || !args[0].equals("consume")) {
            return usage("a mode: consume");
        }
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < args.length; i += 2) {
            if (i + 1 >= args.length) {
                return usage(args[i] + " needs a value");
            }
            opts.put(args[i], args[i + 1]);
        }
        for (String required : List.of("--bootstrap", "--registry", "--topic", "--count")) {
            if (!opts.containsKey(required)) {
                return usage("give --bootstrap, --registry, --topic and --count");
            }
        }
        String topic = opts.get("--topic");
        int count = Integer.parseInt(opts.get("--count"));
        long deadline = System.nanoTime() + Duration.ofMillis(
                Long.parseLong(opts.getOrDefault("--timeout-ms", "60000"))).toNanos();

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, opts.get("--bootstrap"));
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        // Raw bytes first: the deserializer is called by hand so the id the value carried can be printed.
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        // A streamsched Producer may write in transactions: never print an aborted record.
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");

        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
             AvroKafkaDeserializer<GenericRecord> avro = new AvroKafkaDeserializer<>()) {
            // The same settings as the producer's serializer: a 4-byte content id, no headers.
            avro.configure(RegistryTransitionProducer.serdeConfig(opts.get("--registry")), false);
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                partitions.add(new TopicPartition(topic, p.partition()));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            int printed = 0;
            while (printed < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(500))) {
                    ObjectNode line;
                    try {
                        line = toJson(avro.deserialize(topic, rec.value()));
                    } catch (RuntimeException e) {
                        System.err.println("record " + rec.partition() + "/" + rec.offset()
                                + " does not decode: " + e);
                        return 3;
                    }
                    line.put("partition", rec.partition());
                    line.put("offset", rec.offset());
                    line.put("key", rec.key() == null ? null : new String(rec.key(), StandardCharsets.UTF_8));
                    line.put("schema_id", schemaId(rec.value()));
                    System.out.println(TransitionProducer.JSON.writeValueAsString(line));
                    printed++;
                }
            }
            if (printed < count) {
                System.err.println("read " + printed + " of " + count + " records before the timeout");
                return 1;
            }
            return 0;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The id after the magic byte, or -1 if the value is not in the registry format. */
    static long schemaId(byte[] value) {
        if (value == null || value.length < 5 || value[0] != 0) {
            return -1;
        }
        return Integer.toUnsignedLong(ByteBuffer.wrap(value, 1, 4).getInt());
    }

    /** Every field of the record by name, in the writer schema's order. */
    static ObjectNode toJson(GenericRecord r) {
        ObjectNode out = TransitionProducer.JSON.createObjectNode();
        for (Schema.Field f : r.getSchema().getFields()) {
            out.set(f.name(), toJson(r.get(f.name())));
        }
        return out;
    }

    static JsonNode toJson(Object v) {
        var nodes = TransitionProducer.JSON.getNodeFactory();
        if (v == null) {
            return nodes.nullNode();
        }
        if (v instanceof CharSequence s) {
            return nodes.textNode(s.toString());
        }
        if (v instanceof ByteBuffer b) {
            // payload: JSON text as UTF-8 bytes (the contract); printed as that text.
            try {
                return nodes.textNode(StandardCharsets.UTF_8.newDecoder().decode(b.duplicate()).toString());
            } catch (CharacterCodingException e) {
                throw new IllegalArgumentException("bytes that are not UTF-8");
            }
        }
        if (v instanceof Long n) {
            return nodes.numberNode(n);
        }
        if (v instanceof Integer n) {
            return nodes.numberNode(n);
        }
        if (v instanceof Boolean b) {
            return nodes.booleanNode(b);
        }
        if (v instanceof Iterable<?> items) {
            ArrayNode arr = nodes.arrayNode();
            items.forEach(item -> arr.add(toJson(item)));
            return arr;
        }
        if (v instanceof GenericRecord nested) {
            return toJson(nested);
        }
        return nodes.textNode(v.toString());
    }

    private RegistryTransitionConsumer() { }
}
