// A producer written only from docs/wire-contract.md, with Kafka's Java client and Apache Avro.
//
//   java -cp <kafka-clients + avro> WireProducer.java BOOTSTRAP TOPIC PARTITIONS VECTORS AVSC NAME...
//
// 1. For every valid vector of docs/wire-vectors.json it computes the route key (SHA-256 of the
//    specified pre-image), the envelope (0xA5, schema id 1, Avro binary of the record written by
//    GenericDatumWriter) and the partitions (Utils.murmur2, toPositive, mod n) and compares them
//    with the vector.
// 2. It produces the vectors named on the command line to TOPIC with the Java client's default
//    partitioner (no explicit partition), acks=all and idempotence, and checks that each record
//    landed on the vector's partition for PARTITIONS.
// Prints one JSON line per produced record and a last summary line; exits 1 on any mismatch.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

public class WireProducer {
    static final HexFormat HEX = HexFormat.of();

    static byte[] u32(int n) {
        return ByteBuffer.allocate(4).putInt(n).array();
    }

    static byte[] routeKey(String tenant, List<String> target) throws Exception {
        ByteArrayOutputStream canonical = new ByteArrayOutputStream();
        canonical.write(target.size());
        for (String c : target) {
            byte[] b = c.getBytes(StandardCharsets.UTF_8);
            canonical.write(u32(b.length));
            canonical.write(b);
        }
        byte[] t = tenant.getBytes(StandardCharsets.UTF_8);
        byte[] ct = canonical.toByteArray();
        ByteArrayOutputStream pre = new ByteArrayOutputStream();
        pre.write("streamsched/route-key/v1".getBytes(StandardCharsets.US_ASCII));
        pre.write(0);
        pre.write(1);
        pre.write(u32(t.length));
        pre.write(t);
        pre.write(2);
        pre.write(u32(ct.length));
        pre.write(ct);
        byte[] digest = MessageDigest.getInstance("SHA-256").digest(pre.toByteArray());
        return HEX.formatHex(digest).substring(0, 32).getBytes(StandardCharsets.US_ASCII);
    }

    static byte[] envelope(Schema schema, JsonNode ev) throws Exception {
        GenericRecord r = new GenericData.Record(schema);
        r.put("event_id", ev.get("event_id").asText());
        r.put("type", ev.get("type").asText());
        r.put("tenant", ev.get("tenant").asText());
        r.put("target", targetOf(ev));
        r.put("due_ns", ev.get("due_ns").asLong());
        r.put("payload", ByteBuffer.wrap(ev.get("payload").asText().getBytes(StandardCharsets.UTF_8)));
        r.put("produced_ns", ev.get("produced_ns").asLong());
        r.put("attempt", ev.get("attempt").asInt());
        r.put("origin", ev.get("origin").isNull() ? null : ev.get("origin").asText());
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(0xA5);
        out.write(1);
        BinaryEncoder enc = EncoderFactory.get().binaryEncoder(out, null);
        new GenericDatumWriter<GenericRecord>(schema).write(r, enc);
        enc.flush();
        return out.toByteArray();
    }

    static List<String> targetOf(JsonNode ev) {
        List<String> target = new ArrayList<>();
        ev.get("target").forEach(c -> target.add(c.asText()));
        return target;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        int partitions = Integer.parseInt(args[2]);
        JsonNode vectors = new ObjectMapper().readTree(new File(args[3]));
        Schema schema = new Schema.Parser().parse(new File(args[4]));
        List<String> mismatches = new ArrayList<>();
        Map<String, byte[][]> records = new HashMap<>();
        Map<String, Integer> home = new HashMap<>();
        for (JsonNode v : vectors.get("valid")) {
            String name = v.get("name").asText();
            JsonNode ev = v.get("event");
            byte[] key = routeKey(ev.get("tenant").asText(), targetOf(ev));
            byte[] value = envelope(schema, ev);
            if (!new String(key, StandardCharsets.US_ASCII).equals(v.get("route_key").asText())) {
                mismatches.add(name + ": route key");
            }
            if (!HEX.formatHex(value).equals(v.get("envelope_hex").asText())) {
                mismatches.add(name + ": envelope");
            }
            for (Map.Entry<String, JsonNode> e : v.get("partitions").properties()) {
                int n = Integer.parseInt(e.getKey());
                if (Utils.toPositive(Utils.murmur2(key)) % n != e.getValue().asInt()) {
                    mismatches.add(name + ": partition of " + n);
                }
            }
            records.put(name, new byte[][] {key, value});
            home.put(name, v.get("partitions").get(String.valueOf(partitions)).asInt());
        }

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        int produced = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int i = 5; i < args.length; i++) {
                String name = args[i];
                byte[][] kv = records.get(name);
                if (kv == null) {
                    mismatches.add(name + ": no such vector");
                    continue;
                }
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, kv[0], kv[1])).get();
                produced++;
                if (md.partition() != home.get(name)) {
                    mismatches.add(name + ": landed on " + md.partition());
                }
                System.out.println("{\"name\": \"" + name + "\", \"partition\": " + md.partition()
                        + ", \"offset\": " + md.offset() + "}");
            }
        }
        StringBuilder list = new StringBuilder();
        for (String m : mismatches) {
            list.append(list.length() == 0 ? "" : ", ").append('"').append(m).append('"');
        }
        System.out.println("{\"checked\": " + records.size() + ", \"produced\": " + produced
                + ", \"mismatches\": [" + list + "]}");
        System.exit(mismatches.isEmpty() ? 0 : 1);
    }
}
