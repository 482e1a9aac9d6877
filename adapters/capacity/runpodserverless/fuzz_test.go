package runpodserverless

import (
	"encoding/json"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/adapters/capacity/ephemeral"
)

// FuzzDecodeJob: whatever a status answer holds, decoding never panics and
// what it lets through is a known state, bounded output and valid text.
func FuzzDecodeJob(f *testing.F) {
	f.Add([]byte(`{"id":"job-1","status":"COMPLETED","delayTime":1200,"executionTime":20000,"output":{"echo":"hi"}}`))
	f.Add([]byte(`{"id":"job-2","status":"FAILED","error":{"message":"boom"}}`))
	f.Add([]byte(`{"id":"job-3","status":"SOMETHING","delayTime":-5,"executionTime":1e308,"output":"` + "\xff" + `"}`))
	f.Add([]byte(`{"jobs":{"inQueue":3},"workers":{"idle":0}}`))
	e := &Executor{now: time.Now}
	f.Fuzz(func(t *testing.T, b []byte) {
		if j, err := decodeJob(b); err == nil {
			x := execution(j, e)
			if !x.State.Valid() || len(x.Output) > ephemeral.MaxOutputBytes || !utf8.ValidString(x.Error) || x.QueueSeconds < 0 || x.RunSeconds < 0 {
				t.Fatalf("execution %+v", x)
			}
		}
		var h wireHealth
		if json.Unmarshal(b, &h) == nil {
			if r := readySeconds(Endpoint{}, h); r < 1 {
				t.Fatalf("ready in %d s", r)
			}
		}
	})
}
