package schemas_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/. Run one target with e.g.
//
//	go test -run='^$' -fuzz='^FuzzRunRequestDecode$' -fuzztime=20s -parallel=2 ./schemas/

// knownBugLossyUTF8: RunRequest.Validate accepts strings that are not valid
// UTF-8 (possible only through msgpack: command, args, env values, label
// values, an image tag). The control plane stores Runs as JSON, which
// rewrites such bytes to U+FFFD, so the stored request differs from the
// accepted one. Until Validate refuses them, the fuzz round trip tolerates
// exactly that difference. Set to false once fixed.
const knownBugLossyUTF8 = false

// runRequestCodes are the refusal codes DecodeRunRequest can answer.
var runRequestCodes = map[schemas.Code]bool{
	schemas.CodeMalformed:          true,
	schemas.CodeUnknownField:       true,
	schemas.CodePayloadTooLarge:    true,
	schemas.CodeUnsupportedVersion: true,
	schemas.CodeMissingField:       true,
	schemas.CodeInvalidRequestID:   true,
	schemas.CodeImageNotPinned:     true,
	schemas.CodeInvalidImage:       true,
	schemas.CodeInvalidDigest:      true,
	schemas.CodeInvalidArtifact:    true,
	schemas.CodeNegativeResource:   true,
	schemas.CodeResourceTooLarge:   true,
	schemas.CodeInvalidEnv:         true,
	schemas.CodeTooManyItems:       true,
	schemas.CodeValueTooLong:       true,
	schemas.CodeInvalidMaxRuntime:  true,
	schemas.CodeInvalidLabel:       true,
	schemas.CodeInvalidPlatform:    true,
	schemas.CodeInvalidGPU:         true,
	schemas.CodeInvalidCache:       true,
	schemas.CodeInvalidNetwork:     true,
	schemas.CodeInvalidShm:         true,
	schemas.CodeInvalidUlimit:      true,
	schemas.CodeInvalidSecretName:  true,
	schemas.CodeInvalidSecretPath:  true,
	schemas.CodeInvalidSecretMode:  true,
	schemas.CodeInvalidPriority:    true,
	schemas.CodeInvalidRetry:       true,
	schemas.CodeInvalidDeadline:    true,
	schemas.CodeInvalidGrace:       true,
	schemas.CodeInvalidSpot:        true,
}

func fuzzHeader(contentType string) nats.Header {
	if contentType == "" {
		return nil
	}
	h := nats.Header{}
	h.Set(codec.ContentTypeHeader, contentType)
	return h
}

func FuzzRunRequestDecode(f *testing.F) {
	f.Add("", []byte(`{"request_id":"r","image":"`+testImage+`"}`))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		h := fuzzHeader(contentType)
		req, enc, err := schemas.DecodeRunRequest(h, body)
		if want := codec.Detect(h, body); enc != want {
			t.Fatalf("encoding = %v, Detect says %v", enc, want)
		}
		if err != nil {
			r, ok := err.(*schemas.Refusal)
			if !ok || r == nil {
				t.Fatalf("error is %T %v, want *schemas.Refusal", err, err)
			}
			if r.Code == "" || r.Reason == "" {
				t.Fatalf("refusal without code or reason: %+v", r)
			}
			if !runRequestCodes[r.Code] {
				t.Fatalf("unexpected refusal code %q: %v", r.Code, r)
			}
			if !errors.Is(err, &schemas.Refusal{Code: r.Code, Field: r.Field}) {
				t.Fatalf("refusal does not match itself: %v", r)
			}
			checkNoEnvLeak(t, body, enc, req, r)
			return
		}
		if err := req.Validate(); err != nil {
			t.Fatalf("decoded request does not validate: %v", err)
		}

		// JSON round trip: what the control plane stores is what it accepted.
		jb, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("json.Marshal: %v", err)
		}
		var again schemas.RunRequest
		if err := codec.Decode(codec.JSON, jb, &again); err != nil {
			t.Fatalf("re-encoded request does not decode: %v\n%s", err, jb)
		}
		if !equalRequests(req, again) {
			if knownBugLossyUTF8 && !requestIsUTF8(req) {
				t.Logf("known bug: request with invalid UTF-8 accepted; JSON round trip is lossy")
			} else {
				t.Fatalf("JSON round trip changed the request:\n %#v\n %#v", req, again)
			}
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("re-decoded request does not validate: %v", err)
		}
		if len(jb) <= schemas.MaxRunRequestBytes {
			if _, _, err := schemas.DecodeRunRequest(fuzzHeader(codec.ContentTypeJSON), jb); err != nil {
				t.Fatalf("re-encoded JSON request refused: %v\n%s", err, jb)
			}
		}

		// msgpack round trip is exact.
		mb, err := codec.Encode(codec.MsgPack, req)
		if err != nil {
			t.Fatalf("msgpack encode: %v", err)
		}
		var mp schemas.RunRequest
		if err := codec.Decode(codec.MsgPack, mb, &mp); err != nil {
			t.Fatalf("re-encoded msgpack request does not decode: %v", err)
		}
		if !equalRequests(req, mp) {
			t.Fatalf("msgpack round trip changed the request:\n %#v\n %#v", req, mp)
		}
	})
}

// checkNoEnvLeak fails t when r's text contains an env value of the input.
// Best effort: it considers values of at least 8 bytes that occur exactly
// once in the body, so text the refusal legitimately echoes from elsewhere in
// the body (an unknown field's name, a number) is not mistaken for a leak.
func checkNoEnvLeak(t *testing.T, body []byte, enc codec.Encoding, req schemas.RunRequest, r *schemas.Refusal) {
	t.Helper()
	values := map[string]bool{}
	for _, v := range req.Env {
		values[v] = true
	}
	// Values a lenient decoder can see even where the strict one stopped.
	var lenient struct {
		Env map[string]string `json:"env"`
	}
	if enc == codec.JSON {
		_ = json.Unmarshal(body, &lenient)
	} else {
		dec := msgpack.NewDecoder(bytes.NewReader(body))
		dec.SetCustomStructTag("json")
		_ = dec.Decode(&lenient)
	}
	for _, v := range lenient.Env {
		values[v] = true
	}
	text := r.Error()
	for v := range values {
		if len(v) < 8 || bytes.Count(body, []byte(v)) != 1 {
			continue
		}
		if strings.Contains(text, v) {
			t.Fatalf("refusal %q echoes env value %q", text, v)
		}
	}
}

// equalRequests compares requests, treating empty and absent collections as
// equal (omitempty drops an empty one on the way out).
func equalRequests(a, b schemas.RunRequest) bool {
	emptyToNil(reflect.ValueOf(&a).Elem())
	emptyToNil(reflect.ValueOf(&b).Elem())
	return reflect.DeepEqual(a, b)
}

// emptyToNil sets every empty slice and map reachable from v to nil.
func emptyToNil(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			emptyToNil(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				emptyToNil(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			if v.CanSet() {
				v.SetZero()
			}
			return
		}
		if v.Kind() == reflect.Slice {
			for i := range v.Len() {
				emptyToNil(v.Index(i))
			}
		}
	}
}

// requestIsUTF8 reports whether every string in r, keys included, is valid
// UTF-8.
func requestIsUTF8(r schemas.RunRequest) bool {
	return stringsUTF8(reflect.ValueOf(r))
}

func stringsUTF8(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		return utf8.ValidString(v.String())
	case reflect.Pointer:
		return v.IsNil() || stringsUTF8(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && !stringsUTF8(v.Field(i)) {
				return false
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			if !stringsUTF8(v.Index(i)) {
				return false
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			if !stringsUTF8(it.Key()) || !stringsUTF8(it.Value()) {
				return false
			}
		}
	}
	return true
}

// decodeAndValidate is the path the agent and the control plane take for
// node-facing messages. It fails t on any error that is neither a codec
// ErrMalformed nor a coded *schemas.Refusal, and reports whether v is valid.
func decodeAndValidate(t *testing.T, contentType string, body []byte, v interface{ Validate() error }) bool {
	t.Helper()
	h := fuzzHeader(contentType)
	if err := codec.Decode(codec.Detect(h, body), body, v); err != nil {
		if !errors.Is(err, codec.ErrMalformed) {
			t.Fatalf("decode error does not match ErrMalformed: %v", err)
		}
		return false
	}
	err := v.Validate()
	if err == nil {
		return true
	}
	r, ok := err.(*schemas.Refusal)
	if !ok || r == nil || r.Code == "" || r.Reason == "" {
		t.Fatalf("Validate returned %T %v, want a coded *schemas.Refusal", err, err)
	}
	return false
}

// reencode checks that a validated message survives msgpack, the encoding
// the bus uses, and still validates.
func reencode[T any, PT interface {
	*T
	Validate() error
}](t *testing.T, v PT) {
	t.Helper()
	b, err := codec.Encode(codec.MsgPack, v)
	if err != nil {
		t.Fatalf("msgpack encode: %v", err)
	}
	var again T
	if err := codec.Decode(codec.MsgPack, b, &again); err != nil {
		t.Fatalf("re-encoded message does not decode: %v", err)
	}
	if err := PT(&again).Validate(); err != nil {
		t.Fatalf("re-encoded message does not validate: %v", err)
	}
}

func FuzzCommandDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var c schemas.Command
		if !decodeAndValidate(t, contentType, body, &c) {
			return
		}
		payloads := map[schemas.CommandKind]bool{
			schemas.CmdPrepareImage:    c.PrepareImage != nil,
			schemas.CmdPrepareArtifact: c.PrepareArtifact != nil,
			schemas.CmdLaunchWorkload:  c.Launch != nil,
			schemas.CmdStopWorkload:    c.Stop != nil,
		}
		set := 0
		for _, p := range payloads {
			if p {
				set++
			}
		}
		switch c.Kind {
		case schemas.CmdReconcile:
			if set != 0 {
				t.Fatalf("valid reconcile command carries %d payloads: %+v", set, c)
			}
		case schemas.CmdPrepareImage, schemas.CmdPrepareArtifact, schemas.CmdLaunchWorkload, schemas.CmdStopWorkload:
			if set != 1 || !payloads[c.Kind] {
				t.Fatalf("valid %s command has payloads %v", c.Kind, payloads)
			}
		default:
			t.Fatalf("valid command of unknown kind %q", c.Kind)
		}
		if c.FencingToken == 0 {
			t.Fatal("valid command without a fencing token")
		}
		if c.Launch != nil {
			if _, err := schemas.ParseImageRef("r", c.Launch.Reference); err != nil {
				t.Fatalf("valid launch with bad reference: %v", err)
			}
			switch schemas.NetworkModeOf(c.Launch.Network) {
			case schemas.NetworkBridge, schemas.NetworkHost, schemas.NetworkNone:
			default:
				t.Fatalf("valid launch with network %q", c.Launch.Network)
			}
		}
		if c.PrepareImage != nil {
			if _, err := schemas.ParseImageRef("r", c.PrepareImage.Reference); err != nil {
				t.Fatalf("valid prepare with bad reference: %v", err)
			}
		}
		var named *schemas.Platform
		switch {
		case c.PrepareImage != nil:
			named = c.PrepareImage.Platform
		case c.Launch != nil:
			named = c.Launch.Platform
		}
		// A platform reaches containerd's parser: one word per part, never
		// a path or a second platform.
		if named != nil && (named.OS == "" || named.Architecture == "" || strings.ContainsAny(named.String(), " .,\\\x00") || strings.Count(named.String(), "/") > 2) {
			t.Fatalf("valid command names platform %q", named.String())
		}
		reencode(t, &c)
	})
}

func FuzzObservationDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var o schemas.Observation
		if !decodeAndValidate(t, contentType, body, &o) {
			return
		}
		var ok bool
		switch o.Kind {
		case schemas.ObsReceipt:
			ok = o.Receipt != nil
		case schemas.ObsWorkload:
			ok = o.Workload != nil
		case schemas.ObsFacts:
			ok = o.Facts != nil
		case schemas.ObsReconciliation:
			ok = o.Reconciliation != nil
		case schemas.ObsImageProgress:
			ok = o.ImageProgress != nil && o.ImageProgress.Progress.DoneBytes >= 0
		}
		if !ok {
			t.Fatalf("valid observation of kind %q lacks its payload: %+v", o.Kind, o)
		}
		if err := schemas.ValidateID("node_id", o.NodeID, schemas.CodeMalformed); err != nil {
			t.Fatalf("valid observation with bad node id: %v", err)
		}
		reencode(t, &o)
	})
}

func FuzzEnrollmentRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var e schemas.EnrollmentRequest
		if !decodeAndValidate(t, contentType, body, &e) {
			return
		}
		c := e.Capacity
		if e.MaxWorkloads < 0 || c.CPUMillis < 0 || c.MemoryBytes < 0 || c.GPUCount < 0 ||
			c.CPUMillis > schemas.MaxCPUMillis || c.MemoryBytes > schemas.MaxMemoryBytes || c.GPUCount > schemas.MaxGPUCount {
			t.Fatalf("valid enrollment out of bounds: %+v", e)
		}
		reencode(t, &e)
	})
}

func FuzzCancelRunDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var c schemas.CancelRun
		h := fuzzHeader(contentType)
		if err := codec.Decode(codec.Detect(h, body), body, &c); err != nil {
			if !errors.Is(err, codec.ErrMalformed) {
				t.Fatalf("decode error does not match ErrMalformed: %v", err)
			}
			return
		}
		// Request ids are per tenant: the one decoded message resolves
		// to a Run of the tenant it was sent under.
		for _, tenant := range []string{schemas.DefaultTenant, "t-1"} {
			c := c
			if err := c.Validate(tenant); err != nil {
				if r, ok := err.(*schemas.Refusal); !ok || r == nil || r.Code == "" || r.Reason == "" {
					t.Fatalf("Validate returned %T %v, want a coded *schemas.Refusal", err, err)
				}
				return
			}
			if err := schemas.ValidateID("run_id", c.RunID, schemas.CodeInvalidRunID); err != nil {
				t.Fatalf("valid cancel without a usable run id: %+v: %v", c, err)
			}
			if c.RequestID != "" && c.RunID != schemas.RunIDFor(tenant, c.RequestID) {
				t.Fatalf("valid cancel names two Runs: %+v", c)
			}
			if c.GraceSeconds < 0 || c.GraceSeconds > schemas.MaxGraceSeconds || len(c.Reason) > 512 {
				t.Fatalf("valid cancel out of bounds: %+v", c)
			}
			again := c
			if err := again.Validate(tenant); err != nil || again != c {
				t.Fatalf("Validate is not idempotent: %+v -> %+v, %v", c, again, err)
			}
			b, err := codec.Encode(codec.MsgPack, c)
			if err != nil {
				t.Fatalf("msgpack encode: %v", err)
			}
			var back schemas.CancelRun
			if err := codec.Decode(codec.MsgPack, b, &back); err != nil || back.Validate(tenant) != nil {
				t.Fatalf("re-encoded cancel does not decode and validate: %v", err)
			}
		}
	})
}

// FuzzInviteRequestDecode is the operator's wf.admin.node.invite body.
func FuzzInviteRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.InviteRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if r.Generation == 0 || r.TTLSeconds < 0 {
			t.Fatalf("valid invite out of bounds: %+v", r)
		}
		if err := schemas.ValidateID("node_id", r.NodeID, schemas.CodeMalformed); err != nil {
			t.Fatalf("valid invite with bad node id: %v", err)
		}
		reencode(t, &r)
	})
}

// FuzzPrefetchRequestDecode is the operator's wf.admin.prefetch body (the
// selector's syntax is fuzzed where it is parsed, controlplane/prefetch).
func FuzzPrefetchRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.PrefetchRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if (r.Image == "") == (r.Artifact == "") {
			t.Fatalf("valid prefetch names not exactly one of image and artifact: %+v", r)
		}
		if _, err := schemas.ParseImageRef("image", r.Image); r.Image != "" && err != nil {
			t.Fatalf("valid prefetch with an unpinned image: %v", err)
		}
		if _, err := schemas.ParseArtifactRef("artifact", r.Artifact); r.Artifact != "" && err != nil {
			t.Fatalf("valid prefetch with a malformed artifact: %v", err)
		}
		if r.Count < 0 || r.Count > schemas.MaxPrefetchNodes || r.Timeout() <= 0 || r.Timeout() > schemas.MaxPrefetchTimeout || len(r.Nodes) > schemas.MaxSelectorBytes {
			t.Fatalf("valid prefetch out of bounds: %+v", r)
		}
		if !schemas.ValidTenant(r.TenantOf()) {
			t.Fatalf("valid prefetch of tenant %q", r.Tenant)
		}
		reencode(t, &r)
	})
}

// FuzzRegistryCredentialRequestDecode: what a node sends when it asks for
// a registry credential decodes and validates, or is refused; a valid one
// names a pinned image whose registry is a canonical host.
func FuzzRegistryCredentialRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.RegistryCredentialRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		ref, err := schemas.ParseImageRef("reference", r.Reference)
		if err != nil || r.FencingToken == 0 {
			t.Fatalf("valid request %+v: %v", r, err)
		}
		if reg := ref.Registry(); reg == "" || schemas.CanonicalRegistry(reg) != reg {
			t.Fatalf("registry %q of %q is not canonical", reg, r.Reference)
		}
		reencode(t, &r)
	})
}

// FuzzPruneRequestDecode is the operator's wf.admin.node.prune body.
func FuzzPruneRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.PruneRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if err := schemas.ValidateID("node_id", r.NodeID, schemas.CodeMalformed); err != nil {
			t.Fatalf("valid prune with bad node id: %v", err)
		}
		reencode(t, &r)
	})
}

// FuzzDiskPruneDecode is the control plane's wf.node.<id>.disk.prune body,
// as the agent reads it.
func FuzzDiskPruneDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var p schemas.DiskPrune
		if !decodeAndValidate(t, contentType, body, &p) {
			return
		}
		if p.FencingToken == 0 || len(p.Keep.Items) > schemas.MaxKeepItems {
			t.Fatalf("valid prune out of bounds: %+v", p)
		}
		for _, it := range p.Keep.Items {
			if (it.Kind != schemas.DiskItemImage && it.Kind != schemas.DiskItemCache && it.Kind != schemas.DiskItemArtifact) || it.ID == "" {
				t.Fatalf("valid prune keeps a bad item: %+v", it)
			}
		}
		reencode(t, &p)
	})
}

// FuzzDiskKeepRequestDecode is a node's wf.node.<id>.disk.keep body, as
// the control plane reads it.
func FuzzDiskKeepRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.DiskKeepRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if r.FencingToken == 0 {
			t.Fatalf("valid keep request without a fencing token: %+v", r)
		}
		reencode(t, &r)
	})
}

// FuzzNodeReplyDecode: what the control plane answers an agent's asks
// (a registry credential, what its disk must keep) decodes or is refused
// as malformed; a credential never prints its secret, and a keep list the
// agent accepts survives msgpack.
func FuzzNodeReplyDecode(f *testing.F) {
	f.Add("application/json", []byte(`{"ok":{"registry":"registry.example.com","username":"robot","secret":"s3cret-value"}}`))
	f.Add("application/json", []byte(`{"ok":{"registry":"ghcr.io","anonymous":true}}`))
	f.Add("application/json", []byte(`{"refusal":{"code":"image_not_wanted","field":"reference","reason":"no booking"}}`))
	f.Add("application/json", []byte(`{"ok":{"items":[{"kind":"image","id":"sha256:00"}]}}`))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		h := fuzzHeader(contentType)
		var cred schemas.Reply[schemas.RegistryCredential]
		if err := codec.Decode(codec.Detect(h, body), body, &cred); err != nil {
			if !errors.Is(err, codec.ErrMalformed) {
				t.Fatalf("decode error does not match ErrMalformed: %v", err)
			}
		} else if c := cred.OK; c != nil && len(c.Secret) >= 8 && !strings.Contains(c.Registry+c.Username, c.Secret) {
			for _, s := range []string{c.String(), fmt.Sprintf("%v %+v %#v %s", *c, *c, *c, *c)} {
				if strings.Contains(s, c.Secret) {
					t.Fatalf("a credential prints its secret: %q", s)
				}
			}
		}
		var keep schemas.Reply[schemas.DiskKeep]
		if err := codec.Decode(codec.Detect(h, body), body, &keep); err != nil {
			if !errors.Is(err, codec.ErrMalformed) {
				t.Fatalf("decode error does not match ErrMalformed: %v", err)
			}
			return
		}
		if keep.OK != nil && keep.OK.Validate() == nil {
			reencode(t, keep.OK)
		}
	})
}

func FuzzArtifactCredentialRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.ArtifactCredentialRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if schemas.ObjectStoreDigest(r.Digest) == "" {
			t.Fatalf("accepted digest %q has no object store form", r.Digest)
		}
	})
}

func FuzzArtifactSourceValidate(f *testing.F) {
	f.Fuzz(func(t *testing.T, object, rawURL string) {
		s := schemas.ArtifactSource{Object: object, URL: rawURL}
		err := s.Validate("source")
		if err != nil {
			if r := schemas.AsRefusal(err); r == nil || r.Code == "" {
				t.Fatalf("error is not a coded refusal: %v", err)
			}
			return
		}
		if rawURL == "" {
			return
		}
		u, perr := url.Parse(rawURL)
		if perr != nil || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" && u.Host == "" {
			t.Fatalf("accepted a URL that can carry a credential or has no host: %q", rawURL)
		}
	})
}
