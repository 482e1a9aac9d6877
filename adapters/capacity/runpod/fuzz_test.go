package runpod

import (
	"strings"
	"testing"
	"time"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// The decoders read whatever RunPod (or anything in between) sends.
// Whatever the bytes, they must not panic, and what they let through must
// be usable: states from our vocabulary, observations without the pod's
// environment, offers with sane quantities and ids that are refs.

func fuzzProvider() *Provider {
	cfg := Config{Image: "agent"}
	cfg.defaults()
	return &Provider{cfg: cfg, now: time.Now, gpuTypes: map[string]string{}, stopped: map[string]bool{}}
}

func FuzzDecodePod(f *testing.F) {
	f.Add([]byte(`{"id":"p1","desiredStatus":"RUNNING","costPerHr":"0.74","interruptible":true,"lastStartedAt":"2030-03-01T12:00:00Z","env":{"WARMFLEET_OWNER":"o","WARMFLEET_BOOTSTRAP":"c2VjcmV0"}}`))
	f.Add([]byte(`{"id":"p2","desiredStatus":"EXITED","costPerHr":1.5,"lastStatusChange":"Outbid"}`))
	f.Add([]byte(`{"id":"","costPerHr":"NaN"}`))
	f.Add([]byte(`[{"id":"p3","desiredStatus":"TERMINATED","costPerHr":"-1"}]`))
	p := fuzzProvider()
	f.Fuzz(func(t *testing.T, b []byte) {
		pods, _ := decodePods(b)
		if pod, err := decodePod(b); err == nil {
			pods = append(pods, pod)
		}
		for _, pod := range pods {
			if !p.stateOf(pod).Valid() {
				t.Fatalf("state %q", p.stateOf(pod))
			}
			if pod.CostPerHr < 0 {
				t.Fatalf("negative price %v", pod.CostPerHr)
			}
			if js := nativeJSON(pod); strings.Contains(js, "WARMFLEET_") {
				t.Fatalf("native JSON carries the environment: %s", js)
			}
			rc := p.receipt(pod, false)
			if rc.Pricing.MicrosPerHour < 0 || !rc.State.Valid() {
				t.Fatalf("receipt %+v", rc)
			}
			_ = p.interrupted(pod)
		}
	})
}

func FuzzDecodeGPUTypes(f *testing.F) {
	f.Add([]byte(`{"data":{"gpuTypes":[{"id":"NVIDIA A100 80GB PCIe","memoryInGb":80,"secureCloud":true,"securePrice":1.64,"secureSpotPrice":0.82}]}}`))
	f.Add([]byte(`{"errors":[{"message":"bad"}]}`))
	f.Add([]byte(`{"data":{"gpuTypes":[{"id":"x\u0000 y","memoryInGb":-1,"secureCloud":true,"securePrice":1e300}]}}`))
	p := fuzzProvider()
	f.Fuzz(func(t *testing.T, b []byte) {
		types, err := decodeGPUTypes(b)
		if err != nil {
			return
		}
		for _, gt := range types {
			for _, o := range p.offersOf(gt) {
				if err := (capacity.ProvisionCommand{ConnectionID: "c", OperationKey: "k", RentalID: "r", Generation: 1, OwnershipToken: "o", OfferID: o.ID}).Validate(); err != nil {
					t.Fatalf("offer id %q is not a ref: %v", o.ID, err)
				}
				if o.PricePerHour.MicrosPerHour <= 0 || o.GPUCount <= 0 || o.GPUMemoryBytes < 0 || o.CPUMillis <= 0 {
					t.Fatalf("offer %+v", o)
				}
			}
		}
	})
}
