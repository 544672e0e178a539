// Command transition-producer produces workflow events ("transitions") that a streamsched
// scheduler executes, following docs/wire-contract.md: the record value is the envelope (0xA5,
// schema id 1) and the schemaless Avro body of a TransitionEvent, the record key is the route
// key, and the partition is murmur2(key) & 0x7fffffff % partitions, as the Java client's.
//
//	transition-producer -bootstrap HOST:PORT -topic TOPIC -type due [-tenant T] [-target C]...
//	                    [-due-ns N] [-payload JSON] [-event-id ID]
//	transition-producer -bootstrap HOST:PORT -topic TOPIC -file EVENTS.json
//
// With -registry URL (a Confluent-compatible schema registry API) the record value is the schema
// registry's wire format instead, for a topic declared with format = "registry": byte 0, the
// 4-byte big-endian id under which the registry stores transition.avsc (registered under the
// subject TOPIC-value, or with -no-register only looked up), then the same Avro body. The key
// and the partition do not change.
//
// Every event is checked before the first is sent (the worker would dead-letter one outside the
// contract's bounds, not execute it): one refused event and nothing is produced. Prints one JSON
// line per record written (key, partition, offset, schema id). main_test.go checks the encoding
// and the partitioner against the contract's test vectors byte for byte, in both formats.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

const (
	magic    = 0xA5
	schemaID = 1

	// The bounds of docs/wire-contract.md: a record outside them is dead-lettered, not executed.
	maxEventIDChars         = 128
	maxTypeChars            = 64
	maxTenantBytes          = 256
	maxComponents           = 8
	maxCanonicalTargetBytes = 1024
	maxPayloadBytes         = 256 * 1024
	maxJSONDepth            = 64
	maxRecordBytes          = maxPayloadBytes + 8*1024
	reservedPrefix          = "__streamsched"
)

// transitionSchema is a copy of schemas/transition.avsc (a test keeps them identical).
//
//go:embed transition.avsc
var transitionSchema string

var (
	schema = avro.MustParse(transitionSchema)

	// hamba/avro's default writes an array as blocks prefixed with a negative item count and a
	// byte size. That is valid Avro but not the canonical encoding: the worker re-encodes what
	// it decoded and refuses a record whose bytes differ. With the size header off, an array is
	// one block (positive count, items, 0), as every reference encoder writes it; BlockLength is
	// above the contract's 8 target components, so there is only ever one block.
	avroAPI = avro.Config{DisableBlockSizeHeader: true, BlockLength: 1024}.Freeze()

	origin = regexp.MustCompile(
		`^sched:([A-Za-z0-9._-]{1,167}):([A-Za-z0-9._-]{1,200}):(0|[1-9][0-9]{0,18}):(0|-?[1-9][0-9]{0,18})$`)
)

// partitioner puts a keyed record on (murmur2(key) & 0x7fffffff) % partitions: franz-go's
// StickyKeyPartitioner with a nil hasher uses KafkaHasher(murmur2), a port of the Java client's
// Utils.murmur2 + toPositive (kgo/partitioner.go). The client's default, UniformBytesPartitioner
// with keys=true, hashes keys the same way in franz-go v1.22; naming the partitioner keeps the
// contract whatever a later default becomes. Sarama-style or CRC32 hashers put events elsewhere.
var partitioner = kgo.StickyKeyPartitioner(nil)

// Transition is one workflow event, in the field order of the schema.
type Transition struct {
	EventID    string   `avro:"event_id" json:"event_id"`
	Type       string   `avro:"type" json:"type"`
	Tenant     string   `avro:"tenant" json:"tenant"`
	Target     []string `avro:"target" json:"target"`
	DueNs      int64    `avro:"due_ns" json:"due_ns"`
	Payload    []byte   `avro:"payload" json:"-"` // JSON text, sent as is
	ProducedNs int64    `avro:"produced_ns" json:"produced_ns"`
	Attempt    int32    `avro:"attempt" json:"attempt"`
	Origin     *string  `avro:"origin" json:"origin"` // services leave it nil
}

// NewTransition is an event for a service to produce: random id, produced now, first attempt.
func NewTransition(typ, tenant string, target []string, dueNs int64, payload []byte) Transition {
	return Transition{EventID: newEventID(), Type: typ, Tenant: tenant, Target: target, DueNs: dueNs,
		Payload: payload, ProducedNs: time.Now().UnixNano(), Attempt: 1}
}

// newEventID is a random (version 4) UUID.
func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// RouteKey is the record key: the first 16 bytes of SHA-256 over the route-key pre-image, as 32
// lowercase hex characters.
func RouteKey(tenant string, target []string) ([]byte, error) {
	if !utf8.ValidString(tenant) || len(tenant) > maxTenantBytes {
		return nil, errors.New("bound: tenant bytes")
	}
	if len(target) > maxComponents {
		return nil, errors.New("bound: target components")
	}
	canonical := []byte{byte(len(target))}
	for _, c := range target {
		if !utf8.ValidString(c) {
			return nil, errors.New("target: not valid UTF-8")
		}
		canonical = binary.BigEndian.AppendUint32(canonical, uint32(len(c)))
		canonical = append(canonical, c...)
	}
	// Bounds every component too (each at most 1,024 bytes).
	if len(canonical) > maxCanonicalTargetBytes {
		return nil, errors.New("bound: canonical target bytes")
	}
	pre := append([]byte("streamsched/route-key/v1"), 0, 1)
	pre = binary.BigEndian.AppendUint32(pre, uint32(len(tenant)))
	pre = append(pre, tenant...)
	pre = append(pre, 2)
	pre = binary.BigEndian.AppendUint32(pre, uint32(len(canonical)))
	pre = append(pre, canonical...)
	digest := sha256.Sum256(pre)
	return []byte(hex.EncodeToString(digest[:16])), nil
}

// Encode is the record value: magic, schema id, then the plain Avro binary of the record.
func Encode(ev Transition) ([]byte, error) {
	if err := check(ev); err != nil {
		return nil, err
	}
	value, err := appendBody([]byte{magic, schemaID}, ev)
	if err != nil {
		return nil, err
	}
	if len(value) > maxRecordBytes {
		return nil, errors.New("oversize")
	}
	return value, nil
}

// appendBody appends the Avro binary of v (a Transition), written with transition.avsc, to b.
func appendBody(b []byte, v any) ([]byte, error) {
	body, err := avroAPI.Marshal(schema, v)
	if err != nil {
		return nil, err
	}
	return append(b, body...), nil
}

// --- Registry mode -----------------------------------------------------------------------------

// Subject is the registry subject of a topic's record values: the TopicNameStrategy, every
// serializer's default, and where `streamsched schemas register` puts the schema too.
func Subject(topic string) string { return topic + "-value" }

// SchemaID is the id the registry stores transition.avsc under in the topic's subject. With
// register it registers the schema there (the registry answers the existing id when the subject
// already has this schema: registering is idempotent); without, it only looks the schema up, for
// a producer whose registry principal may not write (the subject is registered by an operator).
func SchemaID(ctx context.Context, cl *sr.Client, topic string, register bool) (int, error) {
	// The text of the file, as is: the worker resolves whatever writer schema the id names
	// against its own copy, and this is the schema the body below is written with.
	s := sr.Schema{Schema: transitionSchema, Type: sr.TypeAvro}
	if register {
		return cl.RegisterSchema(ctx, Subject(topic), s, -1, -1)
	}
	found, err := cl.LookupSchema(ctx, Subject(topic), s)
	if err != nil {
		return 0, err
	}
	return found.ID, nil
}

// NewRegistrySerde frames a Transition as the registry wire format with schema id id: the
// Confluent header (byte 0, the id as 4 big-endian bytes; no message index, which only
// protobuf uses), then the same Avro body as Encode writes (and so the same canonical arrays).
func NewRegistrySerde(id int) *sr.Serde {
	serde := sr.NewSerde(sr.Header(&sr.ConfluentHeader{}))
	// Registered for the value type Transition: Serde finds the encoder by the Go type it is given.
	serde.Register(id, Transition{}, sr.AppendEncodeFn(appendBody))
	return serde
}

// EncodeRegistry is the record value in the registry wire format, checked as Encode checks it:
// every bound of the contract holds for a registry-framed record too.
func EncodeRegistry(serde *sr.Serde, ev Transition) ([]byte, error) {
	if err := check(ev); err != nil {
		return nil, err
	}
	value, err := serde.Encode(ev)
	if err != nil {
		return nil, err
	}
	if len(value) > maxRecordBytes {
		return nil, errors.New("oversize")
	}
	return value, nil
}

// registryClient speaks the registry's Confluent-compatible API at url (for Apicurio Registry,
// http://HOST:PORT/apis/ccompat/v7). Add sr.BasicAuth, sr.BearerToken or sr.DialTLSConfig here
// for a registry that asks for them.
func registryClient(url string) (*sr.Client, error) {
	return sr.NewClient(sr.URLs(url), sr.UserAgent("streamsched-transition-producer"))
}

// check refuses what the worker would dead-letter instead of executing.
func check(ev Transition) error {
	if n := utf8.RuneCountInString(ev.EventID); !utf8.ValidString(ev.EventID) || n < 1 || n > maxEventIDChars {
		return errors.New("bound: event_id")
	}
	if n := utf8.RuneCountInString(ev.Type); !utf8.ValidString(ev.Type) || n < 1 || n > maxTypeChars {
		return errors.New("bound: type")
	}
	if _, err := RouteKey(ev.Tenant, ev.Target); err != nil { // tenant and target bounds
		return err
	}
	if ev.DueNs < 0 {
		return errors.New("bound: due_ns")
	}
	if ev.Attempt < 1 {
		return errors.New("bound: attempt")
	}
	if err := checkPayload(ev.Payload); err != nil {
		return err
	}
	if ev.Origin != nil && !validOrigin(*ev.Origin) {
		return errors.New("origin: malformed")
	}
	return nil
}

// checkPayload: one RFC 8259 JSON value in UTF-8, finite numbers, well-formed strings, at most
// maxJSONDepth nested arrays/objects.
func checkPayload(payload []byte) error {
	if len(payload) > maxPayloadBytes {
		return errors.New("bound: payload size")
	}
	if !utf8.Valid(payload) || !json.Valid(payload) || loneSurrogate(payload) {
		return errors.New("payload: invalid json")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errors.New("payload: invalid json")
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '[' || t == '{' {
				if depth++; depth > maxJSONDepth {
					return errors.New("payload: bound: json depth")
				}
			} else {
				depth--
			}
		case json.Number:
			if f, err := strconv.ParseFloat(string(t), 64); err != nil || math.IsInf(f, 0) {
				return errors.New("payload: invalid json")
			}
		}
	}
}

// loneSurrogate reports an escaped UTF-16 surrogate without its pair ("\ud800"), which Go's
// decoder turns into U+FFFD but the worker refuses. payload is valid JSON.
func loneSurrogate(payload []byte) bool {
	inString, pendingHigh := false, false
	for i := 0; i < len(payload); i++ {
		c := payload[i]
		if !inString {
			inString = c == '"'
			continue
		}
		var unit uint64 = 0x10000 // not a \u escape
		switch c {
		case '"':
			inString = false
		case '\\':
			if payload[i+1] == 'u' {
				unit, _ = strconv.ParseUint(string(payload[i+2:i+6]), 16, 16)
				i += 5
			} else {
				i++
			}
		}
		high := unit >= 0xD800 && unit <= 0xDBFF
		low := unit >= 0xDC00 && unit <= 0xDFFF
		if pendingHigh != low {
			return true // a high surrogate not followed by a low one, or a low one alone
		}
		pendingHigh = high
	}
	return pendingHigh
}

func validOrigin(o string) bool {
	m := origin.FindStringSubmatch(o)
	if m == nil {
		return false
	}
	for _, name := range m[1:3] {
		if name == "." || name == ".." || strings.HasPrefix(name, reservedPrefix) {
			return false
		}
	}
	for _, n := range m[3:5] {
		if _, err := strconv.ParseInt(n, 10, 64); err != nil {
			return false // beyond a signed 64-bit integer
		}
	}
	return true
}

// producerOptions are the settings the contract asks for: acks=all and idempotent writes (both
// franz-go defaults, acks named anyway; never DisableIdempotentWrite, retries must not write
// duplicates) and the key-hashing partitioner.
func producerOptions(bootstrap string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(partitioner),
	}
}

// --- Command line ------------------------------------------------------------------------------

type named struct {
	name  string
	event Transition
}

// eventJSON is an event in a file: the fields of the schema; type is required, the others default
// to tenant "", target [], due_ns 0 (due now), payload {}, a random event_id, produced_ns now,
// attempt 1, origin null. payload is the JSON text as a string (the exact bytes sent, as in the
// wire vectors), or any other JSON value (sent as written).
type eventJSON struct {
	EventID    *string         `json:"event_id"`
	Type       *string         `json:"type"`
	Tenant     string          `json:"tenant"`
	Target     []string        `json:"target"`
	DueNs      int64           `json:"due_ns"`
	Payload    json.RawMessage `json:"payload"`
	ProducedNs *int64          `json:"produced_ns"`
	Attempt    *int32          `json:"attempt"`
	Origin     *string         `json:"origin"`
}

func (e eventJSON) transition() (Transition, error) {
	if e.Type == nil {
		return Transition{}, errors.New("an event needs a type")
	}
	payload := []byte("{}")
	if len(e.Payload) > 0 && string(e.Payload) != "null" {
		payload = e.Payload
		if e.Payload[0] == '"' {
			var text string
			if err := json.Unmarshal(e.Payload, &text); err != nil {
				return Transition{}, err
			}
			payload = []byte(text)
		}
	}
	ev := NewTransition(*e.Type, e.Tenant, e.Target, e.DueNs, payload)
	if e.EventID != nil {
		ev.EventID = *e.EventID
	}
	if e.ProducedNs != nil {
		ev.ProducedNs = *e.ProducedNs
	}
	if e.Attempt != nil {
		ev.Attempt = *e.Attempt
	}
	ev.Origin = e.Origin
	return ev, nil
}

// readEvents reads an array of events, or a wire-vectors file (its valid vectors, by name).
func readEvents(data []byte) ([]named, error) {
	var vectors struct {
		Valid []struct {
			Name  string    `json:"name"`
			Event eventJSON `json:"event"`
		} `json:"valid"`
	}
	var list []eventJSON
	var out []named
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("[")) {
		if err := json.Unmarshal(data, &list); err != nil {
			return nil, err
		}
		for _, e := range list {
			ev, err := e.transition()
			if err != nil {
				return nil, err
			}
			out = append(out, named{"", ev})
		}
		return out, nil
	}
	if err := json.Unmarshal(data, &vectors); err != nil {
		return nil, err
	}
	for _, v := range vectors.Valid {
		ev, err := v.Event.transition()
		if err != nil {
			return nil, err
		}
		out = append(out, named{v.Name, ev})
	}
	return out, nil
}

// registrySerde asks the registry at url for the schema id once (the topic's records all share
// it) and returns the Serde that frames values with it.
func registrySerde(url, topic string, register bool) (int, *sr.Serde, error) {
	cl, err := registryClient(url)
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := SchemaID(ctx, cl, topic, register)
	var refused *sr.ResponseError
	if errors.As(err, &refused) {
		// The message alone ("Subject not found.") does not say whether to register, fix the
		// credentials or wait for the registry: the status and the registry's error code do.
		err = fmt.Errorf("HTTP %d, error code %d: %w", refused.StatusCode, refused.ErrorCode, err)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("schema of subject %s: %w", Subject(topic), err)
	}
	return id, NewRegistrySerde(id), nil
}

type components []string

func (c *components) String() string     { return strings.Join(*c, ",") }
func (c *components) Set(v string) error { *c = append(*c, v); return nil }

func main() {
	bootstrap := flag.String("bootstrap", "", "Kafka bootstrap servers, HOST:PORT[,HOST:PORT...]")
	topic := flag.String("topic", "", "the scheduler's transition topic")
	file := flag.String("file", "", "JSON file: an array of events, or a wire-vectors file")
	typ := flag.String("type", "", "event type (the scheduler's selection matches on it)")
	tenant := flag.String("tenant", "", "tenant of the target")
	var target components
	flag.Var(&target, "target", "a component of the target identity (repeat for several)")
	dueNs := flag.Int64("due-ns", 0, "due time, ns since the Unix epoch (0: due now)")
	payload := flag.String("payload", "{}", "JSON payload handed to the handler")
	eventID := flag.String("event-id", "", "event id (default: a random UUID)")
	registry := flag.String("registry", "",
		"schema registry (Confluent-compatible API): write the registry wire format, not the envelope")
	noRegister := flag.Bool("no-register", false,
		"with -registry: only look the schema up under TOPIC-value, never register it")
	flag.Parse()
	if *bootstrap == "" || *topic == "" || (*file == "") == (*typ == "") ||
		(*noRegister && *registry == "") {
		fmt.Fprintln(os.Stderr, "give -bootstrap, -topic, and either -file or -type (with the"+
			" event's flags); -no-register only with -registry")
		flag.Usage()
		os.Exit(2)
	}

	var events []named
	if *file != "" {
		data, err := os.ReadFile(*file)
		if err == nil {
			events, err = readEvents(data)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "reading events:", err)
			os.Exit(2)
		}
	} else {
		ev := NewTransition(*typ, *tenant, target, *dueNs, []byte(*payload))
		if *eventID != "" {
			ev.EventID = *eventID
		}
		events = []named{{"", ev}}
	}

	refuse := func(i int, err error) {
		label := events[i].name
		if label == "" {
			label = fmt.Sprintf("#%d", i)
		}
		fmt.Fprintf(os.Stderr, "event %s refused: %v; nothing produced\n", label, err)
		os.Exit(1)
	}
	// Checked before the registry is asked: a refused event registers nothing either.
	for i, e := range events {
		if err := check(e.event); err != nil {
			refuse(i, err)
		}
	}
	encode := Encode
	schemaIDOut := schemaID // reported on each line: the envelope's fixed id, or the registry's
	if *registry != "" {
		id, serde, err := registrySerde(*registry, *topic, !*noRegister)
		if err != nil {
			fmt.Fprintf(os.Stderr, "schema registry: %v; nothing produced\n", err)
			os.Exit(1)
		}
		schemaIDOut = id
		encode = func(ev Transition) ([]byte, error) { return EncodeRegistry(serde, ev) }
	}

	// Every record is encoded (and so checked) before the first is sent: all or nothing.
	records := make([]*kgo.Record, 0, len(events))
	for i, e := range events {
		key, err := RouteKey(e.event.Tenant, e.event.Target)
		var value []byte
		if err == nil {
			value, err = encode(e.event)
		}
		if err != nil {
			refuse(i, err)
		}
		// No partition set: the partitioner hashes the key (see partitioner).
		records = append(records, &kgo.Record{Topic: *topic, Key: key, Value: value})
	}

	client, err := kgo.NewClient(producerOptions(*bootstrap)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// ProduceSync returns the results in the order the records completed: report them in the
	// order they were given (the records themselves carry their partition and offset).
	errs := map[*kgo.Record]error{}
	for _, r := range client.ProduceSync(ctx, records...) {
		errs[r.Record] = r.Err
	}
	out := json.NewEncoder(os.Stdout)
	failed := false
	for i, r := range records {
		if err := errs[r]; err != nil {
			fmt.Fprintf(os.Stderr, "record %d: %v\n", i, err)
			failed = true
			continue
		}
		line := map[string]any{"event_id": events[i].event.EventID, "key": string(r.Key),
			"partition": r.Partition, "offset": r.Offset, "schema_id": schemaIDOut}
		if events[i].name != "" {
			line["name"] = events[i].name
		}
		_ = out.Encode(line)
	}
	if failed {
		os.Exit(1)
	}
}
