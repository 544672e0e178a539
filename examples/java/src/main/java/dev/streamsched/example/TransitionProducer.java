package dev.streamsched.example;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.Future;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
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
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * Produces workflow events ("transitions") that a streamsched scheduler executes, following
 * docs/wire-contract.md: the record value is the envelope (0xA5, schema id 1) and the schemaless
 * Avro body of a TransitionEvent, the record key is the route key, and the partition is the one
 * the Java client's default partitioner picks for that key.
 *
 * <pre>
 *   produce --bootstrap HOST:PORT --topic TOPIC --type due [--tenant T] [--target C]... [--due-ns N]
 *           [--payload JSON] [--event-id ID] [--config FILE]
 *   produce --bootstrap HOST:PORT --topic TOPIC --file EVENTS.json [--config FILE]
 *   verify  WIRE-VECTORS.json
 * </pre>
 *
 * {@code produce} checks every event first and produces nothing if one is refused (the worker would
 * dead-letter it), then prints one JSON line per record written (key, partition, offset).
 * {@code verify} checks this program's encoding against the contract's test vectors byte for byte.
 */
public final class TransitionProducer {
    static final int MAGIC = 0xA5;
    static final int SCHEMA_ID = 1;

    // The bounds of docs/wire-contract.md: a record outside them is dead-lettered, not executed.
    static final int MAX_EVENT_ID_CHARS = 128;
    static final int MAX_TYPE_CHARS = 64;
    static final int MAX_TENANT_BYTES = 256;
    static final int MAX_COMPONENTS = 8;
    static final int MAX_CANONICAL_TARGET_BYTES = 1024;
    static final int MAX_PAYLOAD_BYTES = 256 * 1024;
    static final int MAX_JSON_DEPTH = 64;
    static final int MAX_RECORD_BYTES = MAX_PAYLOAD_BYTES + 8 * 1024;
    static final String RESERVED_PREFIX = "__streamsched";
    static final Pattern ORIGIN = Pattern.compile(
            "sched:([A-Za-z0-9._-]{1,167}):([A-Za-z0-9._-]{1,200}):(0|[1-9][0-9]{0,18}):(0|-?[1-9][0-9]{0,18})");

    /** The copy of schemas/transition.avsc in src/main/resources (a test keeps them identical). */
    static final Schema SCHEMA = loadSchema();

    static final HexFormat HEX = HexFormat.of();
    static final ObjectMapper JSON = new ObjectMapper();
    // Jackson's defaults are RFC 8259 (no NaN, comments, single quotes, trailing commas or raw
    // control characters); duplicate keys are accepted, as the worker accepts them.
    static final JsonMapper STRICT_JSON = JsonMapper.builder().build();

    /** One workflow event, in the field order of the schema. {@code payload} is JSON text. */
    public record Transition(String eventId, String type, String tenant, List<String> target, long dueNs,
                             String payload, long producedNs, int attempt, String origin) {
        /** A new event for a service to produce: random id, produced now, first attempt, no origin. */
        public static Transition of(String type, String tenant, List<String> target, long dueNs, String payload) {
            return new Transition(UUID.randomUUID().toString(), type, tenant, target, dueNs, payload,
                    nowNs(), 1, null);
        }
    }

    /** Thrown for an event the worker would refuse; the message names the bound, never the value. */
    public static final class Refused extends IllegalArgumentException {
        Refused(String reason) {
            super(reason);
        }
    }

    /** The record key: the first 16 bytes of SHA-256 over the route-key pre-image, as 32 hex characters. */
    public static byte[] routeKey(String tenant, List<String> target) {
        byte[] t = utf8(tenant, "tenant");
        if (t.length > MAX_TENANT_BYTES) {
            throw new Refused("bound: tenant bytes");
        }
        byte[] canonical = canonicalTarget(target);
        ByteArrayOutputStream pre = new ByteArrayOutputStream();
        pre.writeBytes("streamsched/route-key/v1".getBytes(StandardCharsets.US_ASCII));
        pre.write(0);
        pre.write(1);
        pre.writeBytes(u32(t.length));
        pre.writeBytes(t);
        pre.write(2);
        pre.writeBytes(u32(canonical.length));
        pre.writeBytes(canonical);
        byte[] digest = sha256(pre.toByteArray());
        return HEX.formatHex(digest, 0, 16).getBytes(StandardCharsets.US_ASCII);
    }

    static byte[] canonicalTarget(List<String> target) {
        if (target.size() > MAX_COMPONENTS) {
            throw new Refused("bound: target components");
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(target.size());
        for (String component : target) {
            byte[] c = utf8(component, "target");
            out.writeBytes(u32(c.length));
            out.writeBytes(c);
        }
        // Bounds every component too (each at most 1,024 bytes).
        if (out.size() > MAX_CANONICAL_TARGET_BYTES) {
            throw new Refused("bound: canonical target bytes");
        }
        return out.toByteArray();
    }

    /** The transition as a record of {@code schema}: the transition schema, or one that adds fields. */
    public static GenericRecord record(Transition ev, Schema schema) {
        GenericRecord r = new GenericData.Record(schema);
        r.put("event_id", ev.eventId());
        r.put("type", ev.type());
        r.put("tenant", ev.tenant());
        r.put("target", ev.target());
        r.put("due_ns", ev.dueNs());
        r.put("payload", ByteBuffer.wrap(ev.payload().getBytes(StandardCharsets.UTF_8)));
        r.put("produced_ns", ev.producedNs());
        r.put("attempt", ev.attempt());
        r.put("origin", ev.origin());
        return r;
    }

    /** The record value: magic, schema id, then the plain Avro binary of the record. */
    public static byte[] encode(Transition ev) {
        check(ev);
        GenericRecord r = record(ev, SCHEMA);
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(MAGIC);
        out.write(SCHEMA_ID);
        // The default (buffered) BinaryEncoder writes an array as one block with a positive count:
        // the canonical form the worker re-encodes to compare. Never BlockingBinaryEncoder.
        BinaryEncoder enc = EncoderFactory.get().binaryEncoder(out, null);
        try {
            new GenericDatumWriter<GenericRecord>(SCHEMA).write(r, enc);
            enc.flush();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        if (out.size() > MAX_RECORD_BYTES) {
            throw new Refused("oversize");
        }
        return out.toByteArray();
    }

    /** Refuses what the worker would dead-letter instead of executing. */
    static void check(Transition ev) {
        String id = strict(ev.eventId(), "event_id");
        if (id.isEmpty() || id.codePointCount(0, id.length()) > MAX_EVENT_ID_CHARS) {
            throw new Refused("bound: event_id");
        }
        String type = strict(ev.type(), "type");
        if (type.isEmpty() || type.codePointCount(0, type.length()) > MAX_TYPE_CHARS) {
            throw new Refused("bound: type");
        }
        routeKey(ev.tenant(), ev.target()); // tenant and target bounds
        if (ev.dueNs() < 0) {
            throw new Refused("bound: due_ns");
        }
        if (ev.attempt() < 1) {
            throw new Refused("bound: attempt");
        }
        checkPayload(ev.payload());
        if (ev.origin() != null && !validOrigin(strict(ev.origin(), "origin"))) {
            throw new Refused("origin: malformed");
        }
    }

    static void checkPayload(String payload) {
        byte[] bytes = utf8(payload, "payload");
        if (bytes.length > MAX_PAYLOAD_BYTES) {
            throw new Refused("bound: payload size");
        }
        if (payload.startsWith("\uFEFF")) {
            throw new Refused("payload: invalid json"); // Jackson skips a byte-order mark; RFC 8259 does not
        }
        // One JSON value (RFC 8259: no NaN/Infinity, no comments, no trailing text), finite numbers,
        // well-formed strings, at most MAX_JSON_DEPTH nested arrays/objects.
        try (JsonParser p = STRICT_JSON.createParser(bytes)) {
            int depth = 0;
            JsonToken token = p.nextToken();
            if (token == null) {
                throw new Refused("payload: invalid json");
            }
            do {
                switch (token) {
                    case START_OBJECT, START_ARRAY -> {
                        if (++depth > MAX_JSON_DEPTH) {
                            throw new Refused("payload: bound: json depth");
                        }
                    }
                    case END_OBJECT, END_ARRAY -> depth--;
                    case FIELD_NAME, VALUE_STRING -> {
                        // Jackson decodes an escaped lone surrogate ("\ud800"); the worker refuses it.
                        try {
                            strict(p.getText(), "payload");
                        } catch (Refused e) {
                            throw new Refused("payload: invalid json");
                        }
                    }
                    case VALUE_NUMBER_INT, VALUE_NUMBER_FLOAT -> {
                        // The worker reads a number beyond 64 bits as a double: it must be finite.
                        if (!Double.isFinite(p.getDoubleValue())) {
                            throw new Refused("payload: invalid json");
                        }
                    }
                    default -> { }
                }
            } while (depth > 0 && (token = p.nextToken()) != null);
            if (depth != 0 || p.nextToken() != null) {
                throw new Refused("payload: invalid json");
            }
        } catch (IOException e) {
            throw new Refused("payload: invalid json");
        }
    }

    static boolean validOrigin(String origin) {
        Matcher m = ORIGIN.matcher(origin);
        if (!m.matches()) {
            return false;
        }
        for (String name : List.of(m.group(1), m.group(2))) {
            if (name.equals(".") || name.equals("..") || name.startsWith(RESERVED_PREFIX)) {
                return false;
            }
        }
        try {
            Long.parseLong(m.group(3));
            Long.parseLong(m.group(4));
        } catch (NumberFormatException e) {
            return false; // beyond a signed 64-bit integer
        }
        return true;
    }

    /**
     * The producer settings the contract asks for. No {@code partitioner.class} on purpose: for a
     * record with a key the default partitioner picks {@code toPositive(murmur2(key)) % partitions},
     * the route key's home partition. A custom partitioner would send events elsewhere (the worker
     * then forwards them at the cost of a second write).
     */
    public static Properties producerConfig(String bootstrap) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        // The default since Kafka 3.0; explicit because retries must not write duplicates.
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return props;
    }

    // --- Command line --------------------------------------------------------------------------

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            usage("a mode: produce or verify");
        }
        int code = switch (args[0]) {
            case "produce" -> produce(args);
            case "verify" -> {
                if (args.length != 2) {
                    usage("verify takes the path of docs/wire-vectors.json");
                }
                yield verify(JSON.readTree(new File(args[1])));
            }
            default -> usage("unknown mode " + args[0]);
        };
        System.exit(code);
    }

    static int usage(String problem) {
        System.err.println(problem + "\nusage:\n"
                + "  produce --bootstrap HOST:PORT --topic TOPIC --type TYPE [--tenant T] [--target C]...\n"
                + "          [--due-ns N] [--payload JSON] [--event-id ID] [--config FILE]\n"
                + "  produce --bootstrap HOST:PORT --topic TOPIC --file EVENTS.json [--config FILE]\n"
                + "  verify  WIRE-VECTORS.json");
        System.exit(2);
        return 2;
    }

    static int produce(String[] args) throws Exception {
        String bootstrap = null, topic = null, file = null, config = null;
        ObjectNode single = JSON.createObjectNode();
        List<String> target = new ArrayList<>();
        for (int i = 1; i < args.length; i++) {
            String flag = args[i];
            if (i + 1 >= args.length) {
                return usage(flag + " needs a value");
            }
            String value = args[++i];
            switch (flag) {
                case "--bootstrap" -> bootstrap = value;
                case "--topic" -> topic = value;
                case "--file" -> file = value;
                case "--config" -> config = value;
                case "--target" -> target.add(value);
                case "--type" -> single.put("type", value);
                case "--tenant" -> single.put("tenant", value);
                case "--due-ns" -> single.put("due_ns", Long.parseLong(value));
                case "--payload" -> single.put("payload", value);
                case "--event-id" -> single.put("event_id", value);
                default -> {
                    return usage("unknown option " + flag);
                }
            }
        }
        if (bootstrap == null || topic == null || (file == null) == single.isEmpty()) {
            return usage("give --bootstrap, --topic, and either --file or the event's options");
        }
        List<Named> events = new ArrayList<>();
        if (file != null) {
            events.addAll(readEvents(JSON.readTree(new File(file))));
        } else {
            single.set("target", JSON.valueToTree(target));
            events.add(new Named(null, transitionOf(single)));
        }

        // Every record is encoded (and so checked) before the first is sent: all or nothing.
        List<byte[][]> records = new ArrayList<>();
        for (int i = 0; i < events.size(); i++) {
            Named ev = events.get(i);
            try {
                records.add(new byte[][] {routeKey(ev.event.tenant(), ev.event.target()), encode(ev.event)});
            } catch (Refused e) {
                System.err.println("event " + (ev.name != null ? ev.name : "#" + i) + " refused: "
                        + e.getMessage() + "; nothing produced");
                return 1;
            }
        }
        Properties props = producerConfig(bootstrap);
        if (config != null) {
            // Security and other client settings (sasl.*, ssl.*, ...), in the usual properties format.
            try (InputStream in = new FileInputStream(config)) {
                Properties extra = new Properties();
                extra.load(in);
                props.putAll(extra);
            }
        }
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (byte[][] kv : records) {
                // No partition given: the default partitioner hashes the key (see producerConfig).
                sent.add(producer.send(new ProducerRecord<>(topic, kv[0], kv[1])));
            }
            producer.flush();
            for (int i = 0; i < sent.size(); i++) {
                RecordMetadata md = sent.get(i).get();
                ObjectNode line = JSON.createObjectNode();
                if (events.get(i).name != null) {
                    line.put("name", events.get(i).name);
                }
                line.put("event_id", events.get(i).event.eventId());
                line.put("key", new String(records.get(i)[0], StandardCharsets.US_ASCII));
                line.put("partition", md.partition());
                line.put("offset", md.offset());
                System.out.println(JSON.writeValueAsString(line));
            }
        }
        return 0;
    }

    record Named(String name, Transition event) { }

    /**
     * Events from a JSON file: an array of events, or a wire-vectors file (its {@code valid}
     * vectors, by name). An event has the fields of the schema; {@code type} is required, the
     * others default to: tenant "", target [], due_ns 0 (due now), payload {}, a random event_id,
     * produced_ns now, attempt 1, origin null. {@code payload} is the JSON text as a string (the
     * exact bytes sent), or any other JSON value (written compactly).
     */
    static List<Named> readEvents(JsonNode doc) {
        List<Named> events = new ArrayList<>();
        if (doc.isObject() && doc.has("valid")) {
            for (JsonNode v : doc.get("valid")) {
                events.add(new Named(v.get("name").asText(), transitionOf(v.get("event"))));
            }
        } else if (doc.isArray()) {
            for (JsonNode ev : doc) {
                events.add(new Named(null, transitionOf(ev)));
            }
        } else {
            throw new IllegalArgumentException("expected an array of events or a wire-vectors file");
        }
        return events;
    }

    static Transition transitionOf(JsonNode ev) {
        if (!ev.hasNonNull("type")) {
            throw new IllegalArgumentException("an event needs a type");
        }
        List<String> target = new ArrayList<>();
        if (ev.has("target")) {
            ev.get("target").forEach(c -> target.add(c.textValue()));
        }
        JsonNode payload = ev.get("payload");
        String text = payload == null ? "{}" : payload.isTextual() ? payload.textValue() : payload.toString();
        JsonNode origin = ev.get("origin");
        return new Transition(
                ev.hasNonNull("event_id") ? ev.get("event_id").textValue() : UUID.randomUUID().toString(),
                ev.get("type").textValue(),
                ev.hasNonNull("tenant") ? ev.get("tenant").textValue() : "",
                target,
                ev.hasNonNull("due_ns") ? ev.get("due_ns").longValue() : 0L,
                text,
                ev.hasNonNull("produced_ns") ? ev.get("produced_ns").longValue() : nowNs(),
                ev.hasNonNull("attempt") ? ev.get("attempt").intValue() : 1,
                origin == null || origin.isNull() ? null : origin.textValue());
    }

    // --- Test vectors --------------------------------------------------------------------------

    /**
     * Checks every vector of docs/wire-vectors.json: route key, record value and partition of each
     * valid one byte for byte, refusal of each invalid one, and Kafka's murmur2 test values. Prints
     * a JSON summary; 0 when all match.
     */
    static int verify(JsonNode vectors) {
        List<String> mismatches = new ArrayList<>();
        int valid = 0, invalid = 0, murmur = 0;
        if (vectors.get("magic").asInt() != MAGIC || vectors.get("schema_id").asInt() != SCHEMA_ID) {
            mismatches.add("envelope constants");
        }
        for (JsonNode v : vectors.get("valid")) {
            valid++;
            String name = v.get("name").asText();
            try {
                Transition ev = transitionOf(v.get("event"));
                byte[] key = routeKey(ev.tenant(), ev.target());
                if (!new String(key, StandardCharsets.US_ASCII).equals(v.get("route_key").asText())) {
                    mismatches.add(name + ": route key");
                }
                if (!HEX.formatHex(encode(ev)).equals(v.get("envelope_hex").asText())) {
                    mismatches.add(name + ": envelope");
                }
                for (Map.Entry<String, JsonNode> entry : v.get("partitions").properties()) {
                    int n = Integer.parseInt(entry.getKey());
                    // The very function KafkaProducer calls for a keyed record when no
                    // partitioner.class is set (internal API: used here to check, not to produce).
                    if (BuiltInPartitioner.partitionForKey(key, n) != entry.getValue().asInt()) {
                        mismatches.add(name + ": partition of " + n);
                    }
                }
            } catch (RuntimeException e) {
                mismatches.add(name + ": refused (" + e.getMessage() + ")");
            }
        }
        for (JsonNode v : vectors.get("invalid")) {
            invalid++;
            try {
                Transition ev = transitionOf(v.get("event"));
                routeKey(ev.tenant(), ev.target());
                encode(ev);
                mismatches.add(v.get("name").asText() + ": not refused");
            } catch (Refused expected) {
                // what the worker would do too
            }
        }
        for (JsonNode v : vectors.get("murmur2")) {
            murmur++;
            byte[] key = HEX.parseHex(v.get("key_hex").asText());
            if (Utils.murmur2(key) != v.get("murmur2_signed").asInt()
                    || Utils.toPositive(Utils.murmur2(key)) != v.get("murmur2_positive").asInt()) {
                mismatches.add("murmur2 of " + v.get("key_hex").asText());
            }
        }
        // Payloads the worker refuses (or accepts) beyond the vectors' cases.
        for (Map.Entry<String, Boolean> c : PAYLOAD_CASES.entrySet()) {
            boolean accepted;
            try {
                checkPayload(c.getKey());
                accepted = true;
            } catch (Refused e) {
                accepted = false;
            }
            if (accepted != c.getValue()) {
                mismatches.add("payload " + c.getKey() + (accepted ? ": not refused" : ": refused"));
            }
        }
        ObjectNode summary = JSON.createObjectNode();
        summary.put("valid", valid);
        summary.put("invalid", invalid);
        summary.put("murmur2", murmur);
        summary.put("payloads", PAYLOAD_CASES.size());
        summary.set("mismatches", JSON.valueToTree(mismatches));
        System.out.println(summary);
        return mismatches.isEmpty() && valid > 0 ? 0 : 1;
    }

    static final Map<String, Boolean> PAYLOAD_CASES = Map.ofEntries(
            Map.entry("\"\\ud83d\\ude00\"", true),           // an escaped surrogate pair: one character
            Map.entry("\"\\ud800\"", false),                 // a lone surrogate
            Map.entry("{\"k\": \"\\ud83d\\ud83d\"}", false),
            Map.entry("1e400", false),                       // beyond a double
            Map.entry("1e-400", true),
            Map.entry("1" + "0".repeat(400), false),
            Map.entry("\uFEFF{}", false),                    // a byte-order mark
            Map.entry("{\"a\": 1, \"a\": 2}", true),         // duplicate keys: accepted, as by the worker
            Map.entry(" 42 ", true),
            Map.entry("[1,]", false),
            Map.entry("NaN", false),
            Map.entry("[".repeat(MAX_JSON_DEPTH + 1) + "]".repeat(MAX_JSON_DEPTH + 1), false));

    // --- Helpers -------------------------------------------------------------------------------

    static long nowNs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    static Schema loadSchema() {
        try (InputStream in = TransitionProducer.class.getResourceAsStream("/transition.avsc")) {
            return new Schema.Parser().parse(in);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** {@code s} unchanged, or Refused: a Java string may hold a lone surrogate, which is not UTF-8. */
    static String strict(String s, String field) {
        utf8(s, field);
        return s;
    }

    static byte[] utf8(String s, String field) {
        if (s == null) {
            throw new Refused(field + ": missing");
        }
        try {
            ByteBuffer b = StandardCharsets.UTF_8.newEncoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .encode(CharBuffer.wrap(s));
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        } catch (CharacterCodingException e) {
            throw new Refused(field + ": not valid UTF-8");
        }
    }

    static byte[] u32(int n) {
        return ByteBuffer.allocate(4).putInt(n).array();
    }

    static byte[] sha256(byte[] data) {
        try {
            return MessageDigest.getInstance("SHA-256").digest(data);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e); // every Java platform has SHA-256
        }
    }

    private TransitionProducer() { }
}
