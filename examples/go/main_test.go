package main

// The contract's test vectors (docs/wire-vectors.json), byte for byte: route key, record value
// (the envelope, and the registry wire format), and the partition the producer's partitioner
// picks for each partition count. Outside the streamsched repository, copy the file and point
// WIRE_VECTORS at it.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

type vectorsFile struct {
	Magic    int `json:"magic"`
	SchemaID int `json:"schema_id"`
	Murmur2  []struct {
		KeyHex   string `json:"key_hex"`
		Positive int    `json:"murmur2_positive"`
	} `json:"murmur2"`
	Valid []struct {
		Name        string         `json:"name"`
		Event       eventJSON      `json:"event"`
		RouteKey    string         `json:"route_key"`
		Partitions  map[string]int `json:"partitions"`
		EnvelopeHex string         `json:"envelope_hex"`
	} `json:"valid"`
	Invalid []struct {
		Name  string    `json:"name"`
		Event eventJSON `json:"event"`
	} `json:"invalid"`
}

func loadVectors(t *testing.T) vectorsFile {
	t.Helper()
	path := os.Getenv("WIRE_VECTORS")
	if path == "" {
		path = "../../docs/wire-vectors.json"
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the wire vectors (set WIRE_VECTORS to docs/wire-vectors.json): %v", err)
	}
	var v vectorsFile
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if v.Magic != magic || v.SchemaID != schemaID || len(v.Valid) == 0 || len(v.Invalid) == 0 {
		t.Fatalf("unexpected vectors file %s", path)
	}
	return v
}

// partitionOf asks the very partitioner the client is configured with.
func partitionOf(key []byte, partitions int) int {
	return partitioner.ForTopic("transitions").Partition(&kgo.Record{Key: key}, partitions)
}

func TestValidVectors(t *testing.T) {
	for _, v := range loadVectors(t).Valid {
		t.Run(v.Name, func(t *testing.T) {
			ev, err := v.Event.transition()
			if err != nil {
				t.Fatal(err)
			}
			key, err := RouteKey(ev.Tenant, ev.Target)
			if err != nil || string(key) != v.RouteKey {
				t.Errorf("route key %q (%v), want %q", key, err, v.RouteKey)
			}
			value, err := Encode(ev)
			if err != nil || hex.EncodeToString(value) != v.EnvelopeHex {
				t.Errorf("envelope %x (%v)\n want %s", value, err, v.EnvelopeHex)
			}
			for n, want := range v.Partitions {
				count, _ := strconv.Atoi(n)
				if got := partitionOf(key, count); got != want {
					t.Errorf("partition of %d: %d, want %d", count, got, want)
				}
			}
		})
	}
}

func TestInvalidVectorsRefused(t *testing.T) {
	for _, v := range loadVectors(t).Invalid {
		t.Run(v.Name, func(t *testing.T) {
			ev, err := v.Event.transition()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Encode(ev); err == nil {
				t.Error("encoded; the worker would dead-letter it")
			}
		})
	}
}

// Kafka's own murmur2 test values: with 2^31 partitions the partition is the masked hash itself.
func TestKafkaMurmur2(t *testing.T) {
	if strconv.IntSize < 64 {
		t.Skip("2^31 partitions need a 64-bit int")
	}
	for _, v := range loadVectors(t).Murmur2 {
		key, _ := hex.DecodeString(v.KeyHex)
		if got := partitionOf(key, 1<<31); got != v.Positive {
			t.Errorf("murmur2 of %s: %d, want %d", v.KeyHex, got, v.Positive)
		}
	}
}

// Payload corner cases beyond the vectors, each decided as the worker decides them.
func TestPayloadCornerCases(t *testing.T) {
	for payload, ok := range map[string]bool{
		`"\ud83d\ude00"`:               true, // a surrogate pair: one character
		`{"a\\ud800": "\\"}`:           true, // escaped backslashes, no escape
		`"\ud800"`:                     false,
		`"\udc00"`:                     false,
		`["\ud800x", 1]`:               false,
		`{"k": "\ud83d\ud83d"}`:        false,
		`1e400`:                        false, // not a finite double
		`1e-400`:                       true,
		"1" + strings.Repeat("0", 400): false, // beyond a double
		"\uFEFF{}":                     false, // a byte-order mark
		strings.Repeat("[", 64) + strings.Repeat("]", 64): true,
		strings.Repeat("[", 65) + strings.Repeat("]", 65): false,
	} {
		if err := checkPayload([]byte(payload)); (err == nil) != ok {
			t.Errorf("%s: %v, want accepted=%v", payload, err, ok)
		}
	}
}

// The registry wire format: byte 0, the id in 4 big-endian bytes, then the contract's Avro body
// (the envelope's bytes after its 2-byte header). An id with four distinct bytes shows the order.
func TestRegistryVectors(t *testing.T) {
	const id = 0x01020304
	serde := NewRegistrySerde(id)
	v := loadVectors(t)
	for _, vec := range v.Valid {
		t.Run(vec.Name, func(t *testing.T) {
			ev, err := vec.Event.transition()
			if err != nil {
				t.Fatal(err)
			}
			value, err := EncodeRegistry(serde, ev)
			if err != nil || hex.EncodeToString(value) != "0001020304"+vec.EnvelopeHex[4:] {
				t.Errorf("registry value %x (%v)\n want 0001020304%s", value, err, vec.EnvelopeHex[4:])
			}
		})
	}
	for _, vec := range v.Invalid {
		t.Run(vec.Name, func(t *testing.T) {
			ev, err := vec.Event.transition()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := EncodeRegistry(serde, ev); err == nil {
				t.Error("encoded; the worker would dead-letter it")
			}
		})
	}
}

// SchemaID against franz-go's in-memory registry: a lookup before the subject exists fails (a
// producer that may not register must not guess an id), registering twice gives one id, a lookup
// then finds it, and the registry serves our schema text under it.
func TestSchemaIDRegistersOnceAndLooksUp(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	cl, err := registryClient(reg.URL())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var missing *sr.ResponseError
	if _, err := SchemaID(ctx, cl, "invoices", false); !errors.As(err, &missing) ||
		missing.StatusCode != http.StatusNotFound {
		t.Fatalf("lookup in an empty registry: %v, want HTTP 404", err)
	}
	id, err := SchemaID(ctx, cl, "invoices", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, register := range []bool{true, false} {
		if again, err := SchemaID(ctx, cl, "invoices", register); err != nil || again != id {
			t.Errorf("register=%v: id %d (%v), want %d", register, again, err, id)
		}
	}
	got, err := cl.SchemaByID(ctx, id)
	if err != nil || got.Schema != transitionSchema {
		t.Errorf("schema %d: %q (%v)", id, got.Schema, err)
	}
	subjects, err := cl.SubjectsByID(ctx, id)
	if err != nil || len(subjects) != 1 || subjects[0] != "invoices-value" {
		t.Errorf("subjects of %d: %v (%v), want [invoices-value]", id, subjects, err)
	}
}
