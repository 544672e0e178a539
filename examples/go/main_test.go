package main

// The contract's test vectors (docs/wire-vectors.json), byte for byte: route key, record value,
// and the partition the producer's partitioner picks for each partition count. Outside the
// streamsched repository, copy the file and point WIRE_VECTORS at it.

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
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
