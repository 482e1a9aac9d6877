package usage

import (
	"encoding/json"
	"math"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// FuzzDecodeUsageRecord: any stored message, in either encoding, decodes
// to a record that validates (a tenant-shaped tenant, its Run and attempt,
// finite non-negative amounts) or is refused; never a panic. A record that
// validates survives a JSON round trip.
func FuzzDecodeUsageRecord(f *testing.F) {
	f.Add("application/json", []byte(`{"run_id":"r-1","tenant":"acme","attempt_id":"r-1-a1","node_id":"n1","gpu_model":"H100","gpus":2,`+
		`"held_from":"2026-12-07T10:00:00Z","ended_at":"2026-12-07T11:30:00Z","seconds":5400,"cost_usd":6,"outcome":"succeeded"}`))
	f.Add("application/json", []byte(`{"run_id":"r-1","tenant":"acme","attempt_id":"r-1-a1","cost_usd":-1}`))
	f.Add("", []byte(`{"run_id":`))
	f.Add("application/msgpack", []byte{0x81, 0xa6, 't', 'e', 'n', 'a', 'n', 't', 0xa4, 'a', 'c', 'm', 'e'})
	// A gpu_model that is not UTF-8 would panic the Prometheus collector.
	f.Add("application/msgpack", append([]byte{0x84,
		0xa6, 't', 'e', 'n', 'a', 'n', 't', 0xa4, 'a', 'c', 'm', 'e',
		0xa6, 'r', 'u', 'n', '_', 'i', 'd', 0xa3, 'r', '-', '1',
		0xaa, 'a', 't', 't', 'e', 'm', 'p', 't', '_', 'i', 'd', 0xa6, 'r', '-', '1', '-', 'a', '1',
		0xa9, 'g', 'p', 'u', '_', 'm', 'o', 'd', 'e', 'l', 0xa1}, 0xff))
	f.Fuzz(func(t *testing.T, contentType string, data []byte) {
		h := nats.Header{}
		if contentType != "" {
			h.Set(codec.ContentTypeHeader, contentType)
		}
		var rec schemas.UsageRecord
		if DecodeRecord(h, data, &rec) != nil {
			return
		}
		if rec.Tenant == "" || rec.AttemptID == "" || rec.GPUs < 0 || !utf8.ValidString(rec.GPUModel) || !(rec.CostUSD >= 0) || !(rec.Seconds >= 0) ||
			math.IsInf(rec.CostUSD, 0) || math.IsInf(rec.Seconds, 0) {
			t.Fatalf("accepted %+v", rec)
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		var again schemas.UsageRecord
		if err := DecodeRecord(nats.Header{codec.ContentTypeHeader: {codec.ContentTypeJSON}}, b, &again); err != nil {
			t.Fatalf("a valid record does not decode again: %v (%s)", err, b)
		}
	})
}
