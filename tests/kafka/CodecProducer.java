// Kafka's own Java producer, one per compression codec, for tests/kafka/test_compression.py.
//
//   java -cp '<broker lib>/*' CodecProducer.java BOOTSTRAP TOPIC < lines
//
// Each stdin line is "CODEC PARTITION KEY_HEX VALUE_HEX" (CODEC: none, gzip, snappy, lz4, zstd).
// Records go to the given partition with a producer whose compression.type is CODEC (acks=all,
// idempotent, linger so consecutive records share a compressed batch). Lines are produced in
// order: when the codec changes, the previous producer is flushed first, so a partition's log
// holds the batches in input order. Prints "produced N" and exits 0, or exits 1 on a failure.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class CodecProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        HexFormat hex = HexFormat.of();
        Map<String, KafkaProducer<byte[], byte[]>> producers = new HashMap<>();
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        String current = null;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        try {
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                if (line.isBlank()) {
                    continue;
                }
                String[] f = line.trim().split(" ");
                String codec = f[0];
                if (current != null && !current.equals(codec)) {
                    producers.get(current).flush();
                }
                current = codec;
                KafkaProducer<byte[], byte[]> p = producers.computeIfAbsent(codec, c -> {
                    Properties props = new Properties();
                    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
                    props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, c);
                    props.put(ProducerConfig.ACKS_CONFIG, "all");
                    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
                    props.put(ProducerConfig.LINGER_MS_CONFIG, "50");
                    props.put(ProducerConfig.CLIENT_ID_CONFIG, "codec-producer-" + c);
                    return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
                });
                sent.add(p.send(new ProducerRecord<>(topic, Integer.parseInt(f[1]), hex.parseHex(f[2]),
                                                     hex.parseHex(f[3]))));
            }
            for (Future<RecordMetadata> f : sent) {
                f.get();
            }
        } finally {
            for (KafkaProducer<byte[], byte[]> p : producers.values()) {
                p.close();
            }
        }
        System.out.println("produced " + sent.size());
    }
}
