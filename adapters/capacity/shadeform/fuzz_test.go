package shadeform

import (
	"encoding/json"
	"testing"
)

// The decoders read whatever Shadeform (or anything in between) sends.
// Whatever the bytes, they must not panic, and what they let through must
// be usable: offers with non-negative quantities and IDs that parse back,
// states from our vocabulary, observations that never carry the launch
// configuration. (Errors: apicall.FuzzStatusError.)

func FuzzDecodeInstanceTypes(f *testing.F) {
	f.Add([]byte(`{"instance_types":[{"cloud":"aws","region":"us-east-1","shade_instance_type":"A100_80G","hourly_price":210,` +
		`"configuration":{"gpu_type":"A100","num_gpus":1,"vram_per_gpu_in_gb":80,"memory_in_gb":12,"vcpus":6,"storage_in_gb":256},` +
		`"availability":[{"region":"us-east-1","available":true},{"region":"us-west-2","available":false,"rental_type":"spot"}]}]}`))
	f.Add([]byte(`{"instance_types":[{"cloud":"a b","shade_instance_type":"x/y","region":"r%","hourly_price":"1e300",` +
		`"configuration":{"num_gpus":-3,"vram_per_gpu_in_gb":1e30,"vcpus":"12"}}]}`))
	f.Add([]byte(`{"instance_types":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		types, err := decodeInstanceTypes(body)
		if err != nil {
			return
		}
		for _, o := range offersOf(types) {
			if o.GPUCount < 0 || o.GPUMemoryBytes < 0 || o.CPUMillis < 0 || o.MemoryBytes < 0 || o.DiskBytes < 0 || o.PricePerHour.MicrosPerHour < 0 {
				t.Fatalf("negative quantity in %+v", o)
			}
			cloud, region, typ, ok := parseOfferID(o.ID)
			if !ok || cloud != o.Cloud || region != o.Region || offerID(cloud, region, typ) != o.ID {
				t.Fatalf("offer ID %q does not round-trip (%q %q %q %v)", o.ID, cloud, region, typ, ok)
			}
			for i := 0; i < len(o.ID); i++ {
				if o.ID[i] <= ' ' || o.ID[i] >= 0x7f {
					t.Fatalf("offer ID %q is not printable ASCII", o.ID)
				}
			}
			if o.Provider != Type || o.Interruptible || o.PricePerHour.Exact {
				t.Fatalf("offer %+v claims what this adapter never offers", o)
			}
		}
	})
}

func FuzzDecodeInstance(f *testing.F) {
	f.Add([]byte(`{"id":"d290f1ee","status":"active","ip":"1.0.0.1","hourly_price":210,"tags":["wf-owner=us","wf-generation=2"],` +
		`"created_at":"2016-08-29T09:12:33.001Z","active_at":"2016-08-29T09:13:00Z","deleted_at":null,` +
		`"launch_configuration":{"type":"script","script_configuration":{"base64_script":"c2VjcmV0"}}}`))
	f.Add([]byte(`{"id":"x","status":"PENDING_PROVIDER","created_at":12,"hourly_price":null,"tags":["=","wf-generation=99999999999999999999999"]}`))
	f.Add([]byte(`{"id":"","status":"deleted"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		in, err := decodeInstance(body)
		if err != nil {
			return
		}
		if !stateOf(in.Status).Valid() {
			t.Fatalf("status %q maps to %q", in.Status, stateOf(in.Status))
		}
		_ = stateSince(in)
		_ = marksOf(in.Tags).ownedBy("us")
		if p := price(in.HourlyPrice); p.MicrosPerHour < 0 {
			t.Fatalf("negative price %+v", p)
		}
		native := nativeJSON(body)
		if native == "" {
			return
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal([]byte(native), &fields); err != nil {
			t.Fatalf("NativeJSON %q is not a JSON object: %v", native, err)
		}
		for k := range fields {
			if !nativeJSONFields[k] {
				t.Fatalf("NativeJSON keeps field %q", k)
			}
		}
	})
}

func FuzzDecodeInstances(f *testing.F) {
	f.Add([]byte(`{"instances":[{"id":"a","status":"active","tags":["wf-owner=us","wf-rental=r1","wf-operation=op"]},{"id":"b"}]}`))
	f.Add([]byte(`{"instances":{}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		instances, err := decodeInstances(body)
		if err != nil {
			return
		}
		for _, in := range instances {
			m := marksOf(in.Tags)
			if m.ownedBy("") {
				t.Fatalf("an empty token owns %v", in.Tags)
			}
			if m.ownedBy("us") {
				for _, o := range m.owners {
					if o != "us" {
						t.Fatalf("owned by us with owner tag %q", o)
					}
				}
			}
		}
	})
}
