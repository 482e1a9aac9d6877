package schemas_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

const (
	testHex    = "9d75f0d7c398df565d7ac04c6819b62d6d8f9560f5eb4672596ecd8f7e96ae91"
	testDigest = "sha256:" + testHex
	testImage  = "localhost/busybox@" + testDigest
)

// baseRequest is a valid RunRequest as a generic map, so a case can change,
// add or delete any wire field and encode it in either encoding.
func baseRequest() map[string]any {
	return map[string]any{
		"request_id": "req-1",
		"image":      testImage,
		"command":    []any{"sh", "-c", "exit 0"},
		"args":       []any{"--verbose"},
		"env":        map[string]any{"PATH": "/bin", "SECRET_TOKEN": "hunter2"},
		"resources": map[string]any{
			"cpu_millis":   500,
			"memory_bytes": 1 << 30,
			"gpu_count":    1,
		},
		"max_runtime_seconds": 60,
		"labels":              map[string]any{"team": "infra", "tier/critical": ""},
	}
}

// req returns baseRequest with path (dotted) set to v, or deleted when v is
// the deleteField sentinel.
func req(kv ...any) map[string]any {
	m := baseRequest()
	for i := 0; i+1 < len(kv); i += 2 {
		setPath(m, kv[i].(string), kv[i+1])
	}
	return m
}

type deleted struct{}

var deleteField = deleted{}

func setPath(m map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	last := parts[len(parts)-1]
	if _, ok := v.(deleted); ok {
		delete(m, last)
		return
	}
	m[last] = v
}

func jsonBody(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	return b
}

func msgpackBody(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatalf("msgpack.Marshal: %v", err)
	}
	return b
}

func strs(n int, s string) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func envOf(n int) map[string]any {
	m := make(map[string]any, n)
	for i := range n {
		m[fmt.Sprintf("V%03d", i)] = "x"
	}
	return m
}

func cachesOf(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"name": fmt.Sprintf("c%d", i), "path": fmt.Sprintf("/cache/%d", i)}
	}
	return out
}

func strsUlimits(n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"name": "nofile", "soft": 1, "hard": 1}
	}
	return out
}

func labelsOf(n int) map[string]any {
	m := make(map[string]any, n)
	for i := range n {
		m[fmt.Sprintf("l%03d", i)] = "x"
	}
	return m
}

func jsonHeader() nats.Header {
	h := nats.Header{}
	h.Set(codec.ContentTypeHeader, codec.ContentTypeJSON)
	return h
}

func msgpackHeader() nats.Header {
	h := nats.Header{}
	h.Set(codec.ContentTypeHeader, codec.ContentTypeMsgPack)
	return h
}

// padJSON pads a JSON body with trailing whitespace to exactly n bytes.
func padJSON(t testing.TB, b []byte, n int) []byte {
	t.Helper()
	if len(b) > n {
		t.Fatalf("body is %d bytes, more than %d", len(b), n)
	}
	return append(b, strings.Repeat(" ", n-len(b))...)
}

type decodeCase struct {
	name  string
	h     nats.Header
	body  []byte
	code  schemas.Code // "" means the request is valid
	field string
	// secret must not appear in the refusal's text.
	secret string
}

func runRequestCases(t testing.TB) []decodeCase {
	long := strings.Repeat("a", schemas.MaxStringBytes+1)
	secretNUL := "s3cr3t-hunter2\x00-tail"
	secretLong := "s3cr3t-pr3fix-" + strings.Repeat("k", schemas.MaxStringBytes)
	J := func(m map[string]any) []byte { return jsonBody(t, m) }
	M := func(m map[string]any) []byte { return msgpackBody(t, m) }
	huge := append([]byte("{"), strings.Repeat(" ", schemas.MaxRunRequestBytes)...)
	huge = append(huge, J(baseRequest())[1:]...)
	img := func(s string) []byte { return J(req("image", s)) }

	return []decodeCase{
		// Valid requests.
		{name: "valid json", body: J(baseRequest())},
		{name: "valid json by header", h: jsonHeader(), body: J(baseRequest())},
		{name: "valid json leading whitespace", body: append([]byte(" \n\t"), J(baseRequest())...)},
		{name: "valid msgpack", body: M(baseRequest())},
		{name: "valid msgpack by header", h: msgpackHeader(), body: M(baseRequest())},
		{name: "valid minimal", body: []byte(`{"request_id":"r","image":"` + testImage + `"}`)},
		{name: "valid minimal msgpack", body: M(map[string]any{"request_id": "r", "image": testImage})},
		{name: "valid version 1", body: J(req("version", 1))},
		{name: "valid version 0", body: J(req("version", 0))},
		{name: "valid tag beside digest", body: img("localhost/busybox:1.36@" + testDigest)},
		{name: "valid registry port and tag", body: img("localhost:5000/library/busybox:latest@" + testDigest)},
		{name: "valid bare name", body: img("busybox@" + testDigest)},
		{name: "valid request id 128 chars", body: J(req("request_id", "a"+strings.Repeat("._:-", 31)+"abc"))},
		{name: "valid request id with punctuation", body: J(req("request_id", "0:batch.7_x-y"))},
		{name: "valid resources at limits", body: J(req("resources", map[string]any{"cpu_millis": schemas.MaxCPUMillis, "memory_bytes": schemas.MaxMemoryBytes, "gpu_count": schemas.MaxGPUCount}))},
		{name: "valid resources zero", body: J(req("resources", map[string]any{}))},
		{name: "valid max runtime at limit", body: J(req("max_runtime_seconds", schemas.MaxRuntimeSeconds))},
		{name: "valid command at item limit", body: J(req("command", strs(schemas.MaxCommandItems, "x")))},
		{name: "valid command item at length limit", body: J(req("command", []any{strings.Repeat("c", schemas.MaxStringBytes)}))},
		{name: "valid env at item limit", body: J(req("env", envOf(schemas.MaxEnvItems)))},
		{name: "valid env empty value", body: J(req("env", map[string]any{"_": ""}))},
		{name: "valid labels at item limit", body: J(req("labels", labelsOf(schemas.MaxLabelItems)))},
		{name: "valid label key 63 chars", body: J(req("labels", map[string]any{strings.Repeat("k", 63): "v"}))},
		{name: "valid label value 256 bytes", body: J(req("labels", map[string]any{"k": strings.Repeat("v", 256)}))},
		{name: "valid body at size limit", body: padJSON(t, J(baseRequest()), schemas.MaxRunRequestBytes)},
		{name: "valid nulls", body: J(req("command", nil, "env", nil, "labels", nil))},

		{name: "valid platform", body: J(req("platform", map[string]any{"os": "linux", "architecture": "arm64", "variant": "v8"}))},
		{name: "valid gpu requirement", body: J(req("gpu", map[string]any{"model": "H100", "min_memory_bytes": 80 << 30, "min_driver_capability": "12.2"}))},
		{name: "valid caches", body: M(req("caches", []any{
			map[string]any{"name": "pip", "path": "/root/.cache/pip"},
			map[string]any{"name": "hf.models-1", "compatibility_key": "torch-2.3:cu121", "path": "/models", "read_only": true},
		}))},
		{name: "valid caches at item limit", body: J(req("caches", cachesOf(schemas.MaxCaches)))},
		{name: "valid disk at limit", body: J(req("resources.disk_bytes", schemas.MaxMemoryBytes))},
		{name: "valid network bridge", body: J(req("network", "bridge"))},
		{name: "valid network host", body: J(req("network", "host"))},
		{name: "valid network none msgpack", body: M(req("network", "none"))},
		{name: "valid shm at memory limit", body: J(req("shm_bytes", 1<<30))},
		{name: "valid shm without memory limit", body: J(req("shm_bytes", 8<<30, "resources.memory_bytes", 0))},
		{name: "valid ulimits", body: J(req("ulimits", []any{
			map[string]any{"name": "nofile", "soft": 65536, "hard": 65536},
			map[string]any{"name": "memlock", "soft": -1, "hard": -1},
			map[string]any{"name": "core", "soft": 0, "hard": -1},
		}))},
		{name: "valid ulimits msgpack", body: M(req("ulimits", []any{map[string]any{"name": "stack", "soft": 8 << 20, "hard": 16 << 20}}))},

		// malformed_payload
		{name: "empty body", body: nil, code: schemas.CodeMalformed},
		{name: "open brace only", body: []byte("{"), code: schemas.CodeMalformed},
		{name: "truncated json", body: J(baseRequest())[:20], code: schemas.CodeMalformed},
		{name: "json null", body: []byte("null"), code: schemas.CodeMalformed},
		{name: "json array", body: []byte("[]"), code: schemas.CodeMalformed},
		{name: "json trailing data", body: append(J(baseRequest()), []byte(`{}`)...), code: schemas.CodeMalformed},
		{name: "json wrong type", body: J(req("resources.cpu_millis", "500")), code: schemas.CodeMalformed},
		{name: "json fractional number", body: J(req("resources.gpu_count", 1.5)), code: schemas.CodeMalformed},
		{name: "json number overflows int64", body: []byte(`{"request_id":"r","image":"` + testImage + `","max_runtime_seconds":99999999999999999999}`), code: schemas.CodeMalformed},
		{name: "json command not a list", body: J(req("command", "sh -c true")), code: schemas.CodeMalformed},
		{name: "json env value not a string", body: J(req("env", map[string]any{"A": 1})), code: schemas.CodeMalformed},
		{name: "json body with msgpack header", h: msgpackHeader(), body: J(baseRequest()), code: schemas.CodeMalformed},
		{name: "msgpack body with json header", h: jsonHeader(), body: M(baseRequest()), code: schemas.CodeMalformed},
		{name: "msgpack never-used code", body: []byte{0xc1}, code: schemas.CodeMalformed},
		{name: "msgpack array", body: msgpackBody(t, []any{"r", testImage}), code: schemas.CodeMalformed},
		{name: "msgpack truncated", body: M(baseRequest())[:10], code: schemas.CodeMalformed},
		{name: "msgpack trailing data", body: append(M(baseRequest()), 0xc0), code: schemas.CodeMalformed},
		{name: "msgpack wrong type", body: M(req("request_id", 7)), code: schemas.CodeMalformed},

		// unknown_field
		{name: "json unknown field", body: J(req("bogus", 1)), code: schemas.CodeUnknownField, field: "bogus"},
		{name: "json unknown nested field", body: J(req("resources.tpu_count", 1)), code: schemas.CodeUnknownField, field: "tpu_count"},
		{name: "json unknown field named like a go field", body: J(req("MaxRuntime", 1)), code: schemas.CodeUnknownField, field: "MaxRuntime"},
		{name: "json unknown field long name is truncated", body: J(req(strings.Repeat("z", 100), 1)), code: schemas.CodeUnknownField, field: strings.Repeat("z", 64) + "…"},
		{name: "msgpack unknown field", body: M(req("bogus", 1)), code: schemas.CodeUnknownField, field: "bogus"},
		{name: "msgpack unknown nested field", body: M(req("resources.tpu_count", 1)), code: schemas.CodeUnknownField, field: "tpu_count"},
		{name: "msgpack go field name", body: M(req("RequestID", "x")), code: schemas.CodeUnknownField, field: "RequestID"},

		// payload_too_large
		{name: "json too large", body: huge, code: schemas.CodePayloadTooLarge},
		{name: "json one byte too large", body: padJSON(t, J(baseRequest()), schemas.MaxRunRequestBytes+1), code: schemas.CodePayloadTooLarge},
		{name: "too large garbage is too large, not malformed", body: []byte(strings.Repeat("\xc1", schemas.MaxRunRequestBytes+1)), code: schemas.CodePayloadTooLarge},

		// unsupported_version
		{name: "version 2", body: J(req("version", 2)), code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "version -1", body: J(req("version", -1)), code: schemas.CodeUnsupportedVersion, field: "version"},
		{name: "msgpack version 2", body: M(req("version", 2)), code: schemas.CodeUnsupportedVersion, field: "version"},

		// missing_field
		{name: "missing request_id", body: J(req("request_id", deleteField)), code: schemas.CodeMissingField, field: "request_id"},
		{name: "empty request_id", body: J(req("request_id", "")), code: schemas.CodeMissingField, field: "request_id"},
		{name: "missing image", body: J(req("image", deleteField)), code: schemas.CodeMissingField, field: "image"},
		{name: "empty image", body: J(req("image", "")), code: schemas.CodeMissingField, field: "image"},
		{name: "empty object reports request_id first", body: []byte(`{}`), code: schemas.CodeMissingField, field: "request_id"},
		{name: "msgpack missing image", body: M(req("image", deleteField)), code: schemas.CodeMissingField, field: "image"},

		// invalid_request_id
		{name: "request id leading dash", body: J(req("request_id", "-abc")), code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "request id with space", body: J(req("request_id", "a b")), code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "request id with slash", body: J(req("request_id", "a/b")), code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "request id with subject wildcard", body: J(req("request_id", "a*")), code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "request id non-ascii", body: J(req("request_id", "réq")), code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "request id 129 chars", body: J(req("request_id", strings.Repeat("a", 129))), code: schemas.CodeInvalidRequestID, field: "request_id"},
		{name: "request id trailing newline", body: J(req("request_id", "abc\n")), code: schemas.CodeInvalidRequestID, field: "request_id"},

		// image_not_pinned
		{name: "image by tag", body: img("busybox:latest"), code: schemas.CodeImageNotPinned, field: "image"},
		{name: "image by name only", body: img("docker.io/library/busybox"), code: schemas.CodeImageNotPinned, field: "image"},
		{name: "image bare digest", body: img(testDigest), code: schemas.CodeImageNotPinned, field: "image"},

		// invalid_digest
		{name: "digest bad algorithm", body: img("busybox@md5:" + testHex[:32]), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest sha512", body: img("busybox@sha512:" + testHex + testHex), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest short hex", body: img("busybox@sha256:" + testHex[:63]), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest long hex", body: img("busybox@sha256:" + testHex + "0"), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest uppercase hex", body: img("busybox@sha256:" + strings.ToUpper(testHex)), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest uppercase algorithm", body: img("busybox@SHA256:" + testHex), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest without algorithm", body: img("busybox@" + testHex), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest empty", body: img("busybox@"), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "digest non-hex", body: img("busybox@sha256:" + strings.Repeat("g", 64)), code: schemas.CodeInvalidDigest, field: "image"},
		{name: "two digests", body: img("busybox@" + testDigest + "@" + testDigest), code: schemas.CodeInvalidDigest, field: "image"},

		// invalid_image_reference
		{name: "image uppercase repository", body: img("Busybox@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image empty name", body: img("@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image tag without name", body: img(":latest@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image space in name", body: img("busy box@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image leading slash", body: img("/busybox@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image trailing slash", body: img("busybox/@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image empty path component", body: img("library//busybox@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},
		{name: "image scheme", body: img("https://busybox@" + testDigest), code: schemas.CodeInvalidImage, field: "image"},

		// value_too_long
		{name: "image too long", body: img(strings.Repeat("a", schemas.MaxStringBytes) + "@" + testDigest), code: schemas.CodeValueTooLong, field: "image"},
		{name: "command item too long", body: J(req("command", []any{"sh", long})), code: schemas.CodeValueTooLong, field: "command"},
		{name: "command item with NUL", body: J(req("command", []any{"sh\x00"})), code: schemas.CodeValueTooLong, field: "command"},
		{name: "args item too long", body: J(req("args", []any{long})), code: schemas.CodeValueTooLong, field: "args"},
		{name: "args item with NUL", body: M(req("args", []any{"a\x00b"})), code: schemas.CodeValueTooLong, field: "args"},

		// negative_resource
		{name: "negative cpu", body: J(req("resources.cpu_millis", -1)), code: schemas.CodeNegativeResource, field: "resources.cpu_millis"},
		{name: "negative memory", body: J(req("resources.memory_bytes", -1)), code: schemas.CodeNegativeResource, field: "resources.memory_bytes"},
		{name: "negative gpu", body: J(req("resources.gpu_count", -1)), code: schemas.CodeNegativeResource, field: "resources.gpu_count"},
		{name: "msgpack negative gpu", body: M(req("resources.gpu_count", int64(-1<<63))), code: schemas.CodeNegativeResource, field: "resources.gpu_count"},
		{name: "negative cpu reported before large memory", body: J(req("resources.cpu_millis", -1, "resources.memory_bytes", schemas.MaxMemoryBytes+1)), code: schemas.CodeNegativeResource, field: "resources.cpu_millis"},

		// resource_too_large
		{name: "cpu too large", body: J(req("resources.cpu_millis", schemas.MaxCPUMillis+1)), code: schemas.CodeResourceTooLarge, field: "resources.cpu_millis"},
		{name: "memory too large", body: J(req("resources.memory_bytes", schemas.MaxMemoryBytes+1)), code: schemas.CodeResourceTooLarge, field: "resources.memory_bytes"},
		{name: "gpu too large", body: J(req("resources.gpu_count", schemas.MaxGPUCount+1)), code: schemas.CodeResourceTooLarge, field: "resources.gpu_count"},
		{name: "msgpack memory max int64", body: M(req("resources.memory_bytes", int64(1<<63-1))), code: schemas.CodeResourceTooLarge, field: "resources.memory_bytes"},

		// invalid_env
		{name: "env name starts with digit", body: J(req("env", map[string]any{"1BAD": "topsecret-value"})), code: schemas.CodeInvalidEnv, field: "env", secret: "topsecret-value"},
		{name: "env name with dash", body: J(req("env", map[string]any{"BAD-NAME": "topsecret-value"})), code: schemas.CodeInvalidEnv, field: "env", secret: "topsecret-value"},
		{name: "env name with equals", body: J(req("env", map[string]any{"A=B": "topsecret-value"})), code: schemas.CodeInvalidEnv, field: "env", secret: "topsecret-value"},
		{name: "env name empty", body: J(req("env", map[string]any{"": "topsecret-value"})), code: schemas.CodeInvalidEnv, field: "env", secret: "topsecret-value"},
		{name: "env name too long", body: J(req("env", map[string]any{strings.Repeat("N", schemas.MaxStringBytes+1): "topsecret-value"})), code: schemas.CodeInvalidEnv, field: "env", secret: "topsecret-value"},
		{name: "env value with NUL", body: J(req("env", map[string]any{"API_KEY": secretNUL})), code: schemas.CodeInvalidEnv, field: "env.API_KEY", secret: "s3cr3t-hunter2"},
		{name: "env value too long", body: J(req("env", map[string]any{"API_KEY": secretLong})), code: schemas.CodeInvalidEnv, field: "env.API_KEY", secret: "s3cr3t-pr3fix"},
		{name: "msgpack env value with NUL", body: M(req("env", map[string]any{"API_KEY": secretNUL})), code: schemas.CodeInvalidEnv, field: "env.API_KEY", secret: "s3cr3t-hunter2"},

		// too_many_items
		{name: "too many command items", body: J(req("command", strs(schemas.MaxCommandItems+1, "x"))), code: schemas.CodeTooManyItems, field: "command"},
		{name: "too many args", body: J(req("args", strs(schemas.MaxCommandItems+1, "x"))), code: schemas.CodeTooManyItems, field: "args"},
		{name: "too many env", body: J(req("env", envOf(schemas.MaxEnvItems+1))), code: schemas.CodeTooManyItems, field: "env"},
		{name: "too many labels", body: J(req("labels", labelsOf(schemas.MaxLabelItems+1))), code: schemas.CodeTooManyItems, field: "labels"},
		{name: "msgpack too many labels", body: M(req("labels", labelsOf(schemas.MaxLabelItems+1))), code: schemas.CodeTooManyItems, field: "labels"},

		// invalid_max_runtime
		{name: "negative max runtime", body: J(req("max_runtime_seconds", -1)), code: schemas.CodeInvalidMaxRuntime, field: "max_runtime_seconds"},
		{name: "max runtime too long", body: J(req("max_runtime_seconds", schemas.MaxRuntimeSeconds+1)), code: schemas.CodeInvalidMaxRuntime, field: "max_runtime_seconds"},

		// negative_resource, resource_too_large: disk and gpu requirement
		{name: "negative disk", body: J(req("resources.disk_bytes", -1)), code: schemas.CodeNegativeResource, field: "resources.disk_bytes"},
		{name: "disk too large", body: J(req("resources.disk_bytes", schemas.MaxMemoryBytes+1)), code: schemas.CodeResourceTooLarge, field: "resources.disk_bytes"},
		{name: "negative gpu memory", body: J(req("gpu", map[string]any{"min_memory_bytes": -1})), code: schemas.CodeNegativeResource, field: "gpu.min_memory_bytes"},
		{name: "gpu model too long", body: J(req("gpu", map[string]any{"model": strings.Repeat("m", 129)})), code: schemas.CodeValueTooLong, field: "gpu.model"},

		// invalid_platform
		{name: "platform without architecture", body: J(req("platform", map[string]any{"os": "linux"})), code: schemas.CodeInvalidPlatform, field: "platform"},
		{name: "platform empty", body: J(req("platform", map[string]any{})), code: schemas.CodeInvalidPlatform, field: "platform"},

		// invalid_gpu_requirement
		{name: "gpu bad driver capability", body: J(req("gpu", map[string]any{"min_driver_capability": "twelve"})), code: schemas.CodeInvalidGPU, field: "gpu.min_driver_capability"},
		{name: "gpu requirement without gpus", body: J(req("gpu", map[string]any{"model": "H100"}, "resources.gpu_count", 0)), code: schemas.CodeInvalidGPU, field: "gpu"},

		// invalid_cache_mount, too_many_items for caches
		{name: "cache bad name", body: J(req("caches", []any{map[string]any{"name": "Pip", "path": "/c"}})), code: schemas.CodeInvalidCache, field: "caches[0].name"},
		{name: "cache bad compatibility key", body: J(req("caches", []any{map[string]any{"name": "pip", "compatibility_key": "a b", "path": "/c"}})), code: schemas.CodeInvalidCache, field: "caches[0].compatibility_key"},
		{name: "cache relative path", body: J(req("caches", []any{map[string]any{"name": "pip", "path": "c"}})), code: schemas.CodeInvalidCache, field: "caches[0].path"},
		{name: "cache path escapes", body: J(req("caches", []any{map[string]any{"name": "pip", "path": "/c/../../etc"}})), code: schemas.CodeInvalidCache, field: "caches[0].path"},
		{name: "cache at root", body: J(req("caches", []any{map[string]any{"name": "pip", "path": "/"}})), code: schemas.CodeInvalidCache, field: "caches[0].path"},
		{name: "two caches at one path", body: J(req("caches", []any{map[string]any{"name": "a", "path": "/c"}, map[string]any{"name": "b", "path": "/c"}})), code: schemas.CodeInvalidCache, field: "caches[1].path"},
		{name: "too many caches", body: J(req("caches", cachesOf(schemas.MaxCaches+1))), code: schemas.CodeTooManyItems, field: "caches"},

		// invalid_network
		{name: "network unknown", body: J(req("network", "overlay")), code: schemas.CodeInvalidNetwork, field: "network"},
		{name: "network uppercase", body: J(req("network", "HOST")), code: schemas.CodeInvalidNetwork, field: "network"},
		{name: "network msgpack unknown", body: M(req("network", "container:x")), code: schemas.CodeInvalidNetwork, field: "network"},
		{name: "network not a string", body: J(req("network", 1)), code: schemas.CodeMalformed},

		// invalid_shm_bytes, resource_too_large for shm
		{name: "shm negative", body: J(req("shm_bytes", -1)), code: schemas.CodeInvalidShm, field: "shm_bytes"},
		{name: "shm above memory limit", body: J(req("shm_bytes", 2<<30)), code: schemas.CodeInvalidShm, field: "shm_bytes"},
		{name: "shm too large", body: J(req("shm_bytes", schemas.MaxMemoryBytes+1, "resources.memory_bytes", 0)), code: schemas.CodeResourceTooLarge, field: "shm_bytes"},

		// invalid_ulimit, too_many_items for ulimits
		{name: "ulimit unknown name", body: J(req("ulimits", []any{map[string]any{"name": "files", "soft": 1, "hard": 1}})), code: schemas.CodeInvalidUlimit, field: "ulimits[0].name"},
		{name: "ulimit rlimit spelling", body: J(req("ulimits", []any{map[string]any{"name": "RLIMIT_NOFILE", "soft": 1, "hard": 1}})), code: schemas.CodeInvalidUlimit, field: "ulimits[0].name"},
		{name: "ulimit twice", body: J(req("ulimits", []any{map[string]any{"name": "nofile", "soft": 1, "hard": 1}, map[string]any{"name": "nofile", "soft": 2, "hard": 2}})), code: schemas.CodeInvalidUlimit, field: "ulimits[1].name"},
		{name: "ulimit soft above hard", body: J(req("ulimits", []any{map[string]any{"name": "nofile", "soft": 2048, "hard": 1024}})), code: schemas.CodeInvalidUlimit, field: "ulimits[0].soft"},
		{name: "ulimit unlimited soft under a hard limit", body: J(req("ulimits", []any{map[string]any{"name": "nofile", "soft": -1, "hard": 1024}})), code: schemas.CodeInvalidUlimit, field: "ulimits[0].soft"},
		{name: "ulimit soft below -1", body: M(req("ulimits", []any{map[string]any{"name": "core", "soft": -2, "hard": 0}})), code: schemas.CodeInvalidUlimit, field: "ulimits[0].soft"},
		{name: "ulimit hard below -1", body: J(req("ulimits", []any{map[string]any{"name": "core", "soft": 0, "hard": -5}})), code: schemas.CodeInvalidUlimit, field: "ulimits[0].hard"},
		{name: "ulimit unknown field", body: J(req("ulimits", []any{map[string]any{"name": "core", "soft": 0, "hard": 0, "type": "x"}})), code: schemas.CodeUnknownField, field: "type"},
		{name: "too many ulimits", body: J(req("ulimits", strsUlimits(schemas.MaxUlimits+1))), code: schemas.CodeTooManyItems, field: "ulimits"},

		// invalid_label
		{name: "label key leading dash", body: J(req("labels", map[string]any{"-x": "v"})), code: schemas.CodeInvalidLabel, field: "labels"},
		{name: "label key empty", body: J(req("labels", map[string]any{"": "v"})), code: schemas.CodeInvalidLabel, field: "labels"},
		{name: "label key with space", body: J(req("labels", map[string]any{"a b": "v"})), code: schemas.CodeInvalidLabel, field: "labels"},
		{name: "label key 64 chars", body: J(req("labels", map[string]any{strings.Repeat("k", 64): "v"})), code: schemas.CodeInvalidLabel, field: "labels"},
		{name: "label value 257 bytes", body: J(req("labels", map[string]any{"k": strings.Repeat("v", 257)})), code: schemas.CodeInvalidLabel, field: "labels"},
	}
}

func TestDecodeRunRequest(t *testing.T) {
	for _, tc := range runRequestCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			got, enc, err := schemas.DecodeRunRequest(tc.h, tc.body)
			if want := codec.Detect(tc.h, tc.body); enc != want {
				t.Errorf("encoding = %v, want %v", enc, want)
			}
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if got.RequestID == "" || got.Image == "" {
					t.Fatalf("decoded request lacks id or image: %+v", got)
				}
				if err := got.Validate(); err != nil {
					t.Fatalf("decoded request does not validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %s on %q: %+v", tc.code, tc.field, got)
			}
			r, ok := err.(*schemas.Refusal)
			if !ok {
				t.Fatalf("error is %T (%v), want *schemas.Refusal", err, err)
			}
			if r.Code != tc.code || r.Field != tc.field {
				t.Errorf("refusal = %s on %q (%s), want %s on %q", r.Code, r.Field, r.Reason, tc.code, tc.field)
			}
			if r.Reason == "" {
				t.Error("refusal has no reason")
			}
			if !errors.Is(err, &schemas.Refusal{Code: tc.code}) {
				t.Errorf("errors.Is(err, Refusal{%s}) = false", tc.code)
			}
			if tc.secret != "" && (strings.Contains(r.Error(), tc.secret) || strings.Contains(r.Reason, tc.secret)) {
				t.Errorf("refusal %q echoes the env value", r.Error())
			}
		})
	}
}

func TestDecodeRunRequestValues(t *testing.T) {
	want := schemas.RunRequest{
		RequestID: "req-1",
		Image:     testImage,
		Command:   []string{"sh", "-c", "exit 0"},
		Args:      []string{"--verbose"},
		Env:       map[string]string{"PATH": "/bin", "SECRET_TOKEN": "hunter2"},
		Resources: schemas.Resources{CPUMillis: 500, MemoryBytes: 1 << 30, GPUCount: 1},

		MaxRuntimeSeconds: 60,
		Labels:            map[string]string{"team": "infra", "tier/critical": ""},
	}
	for _, tc := range []struct {
		name string
		h    nats.Header
		body []byte
		enc  codec.Encoding
	}{
		{"json", nil, jsonBody(t, baseRequest()), codec.JSON},
		{"msgpack", nil, msgpackBody(t, baseRequest()), codec.MsgPack},
		{"msgpack via codec", nil, mustEncode(t, codec.MsgPack, want), codec.MsgPack},
		{"json via codec", jsonHeader(), mustEncode(t, codec.JSON, want), codec.JSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, enc, err := schemas.DecodeRunRequest(tc.h, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if enc != tc.enc {
				t.Errorf("encoding = %v, want %v", enc, tc.enc)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("decoded\n %+v\nwant\n %+v", got, want)
			}
		})
	}
}

func mustEncode(t testing.TB, e codec.Encoding, v any) []byte {
	t.Helper()
	b, err := codec.Encode(e, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Validate alone reports the same refusals as DecodeRunRequest for values
// built in Go (the control plane validates requests it did not decode).
func TestRunRequestValidate(t *testing.T) {
	valid := schemas.RunRequest{RequestID: "r", Image: testImage}
	if err := valid.Validate(); err != nil {
		t.Fatalf("minimal request refused: %v", err)
	}
	for _, tc := range []struct {
		name  string
		mod   func(*schemas.RunRequest)
		code  schemas.Code
		field string
	}{
		{"version", func(r *schemas.RunRequest) { r.Version = schemas.SchemaVersion + 1 }, schemas.CodeUnsupportedVersion, "version"},
		{"request id", func(r *schemas.RunRequest) { r.RequestID = "" }, schemas.CodeMissingField, "request_id"},
		{"image", func(r *schemas.RunRequest) { r.Image = "busybox" }, schemas.CodeImageNotPinned, "image"},
		{"env value", func(r *schemas.RunRequest) { r.Env = map[string]string{"K": "v\x00"} }, schemas.CodeInvalidEnv, "env.K"},
		{"gpu", func(r *schemas.RunRequest) { r.Resources.GPUCount = -5 }, schemas.CodeNegativeResource, "resources.gpu_count"},
		{"runtime", func(r *schemas.RunRequest) { r.MaxRuntimeSeconds = -1 }, schemas.CodeInvalidMaxRuntime, "max_runtime_seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := valid
			tc.mod(&r)
			err := r.Validate()
			if !errors.Is(err, &schemas.Refusal{Code: tc.code, Field: tc.field}) {
				t.Fatalf("Validate = %v, want %s on %q", err, tc.code, tc.field)
			}
		})
	}
}

func TestParseImageRef(t *testing.T) {
	for _, tc := range []struct {
		in       string
		name     string
		code     schemas.Code
		wantRepo string
	}{
		{in: "busybox@" + testDigest, wantRepo: "busybox"},
		{in: "localhost/busybox@" + testDigest, wantRepo: "localhost/busybox"},
		{in: "localhost/busybox:1.36@" + testDigest, wantRepo: "localhost/busybox"},
		{in: "localhost:5000/busybox@" + testDigest, wantRepo: "localhost:5000/busybox"},
		{in: "localhost:5000/library/busybox:v1@" + testDigest, wantRepo: "localhost:5000/library/busybox"},
		{in: "registry.example.com/team-a/app_x.y@" + testDigest, wantRepo: "registry.example.com/team-a/app_x.y"},
		{in: "a__b/c--d@" + testDigest, wantRepo: "a__b/c--d"},
		{in: "", code: schemas.CodeMissingField},
		{in: strings.Repeat("a", schemas.MaxStringBytes+1), code: schemas.CodeValueTooLong},
		{in: "busybox", code: schemas.CodeImageNotPinned},
		{in: "busybox:1.36", code: schemas.CodeImageNotPinned},
		{in: "busybox@sha256:", code: schemas.CodeInvalidDigest},
		{in: "busybox@sha1:" + testHex[:40], code: schemas.CodeInvalidDigest},
		{in: "busybox@sha256:" + strings.ToUpper(testHex), code: schemas.CodeInvalidDigest},
		{in: "busybox@sha256:" + testHex[1:], code: schemas.CodeInvalidDigest},
		{in: "BusyBox@" + testDigest, code: schemas.CodeInvalidImage},
		{in: "busybox-@" + testDigest, code: schemas.CodeInvalidImage},
		{in: "-busybox@" + testDigest, code: schemas.CodeInvalidImage},
		{in: "busybox___x@" + testDigest, code: schemas.CodeInvalidImage},
		{in: "@" + testDigest, code: schemas.CodeInvalidImage},
	} {
		t.Run(tc.in[:min(len(tc.in), 60)], func(t *testing.T) {
			ref, err := schemas.ParseImageRef("spec.image", tc.in)
			if tc.code != "" {
				r, ok := err.(*schemas.Refusal)
				if !ok {
					t.Fatalf("ParseImageRef = %+v, %v; want refusal %s", ref, err, tc.code)
				}
				if r.Code != tc.code || r.Field != "spec.image" {
					t.Fatalf("refusal %s on %q, want %s on spec.image", r.Code, r.Field, tc.code)
				}
				if ref != (schemas.ImageRef{}) {
					t.Errorf("refused reference returned %+v", ref)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseImageRef: %v", err)
			}
			if ref.Name != tc.wantRepo || ref.Digest != testDigest {
				t.Errorf("ref = %+v, want {%s %s}", ref, tc.wantRepo, testDigest)
			}
			if got, want := ref.String(), tc.wantRepo+"@"+testDigest; got != want {
				t.Errorf("String() = %q, want %q", got, want)
			}
			// The canonical form parses to itself.
			again, err := schemas.ParseImageRef("x", ref.String())
			if err != nil || again != ref {
				t.Errorf("canonical form %q reparsed as %+v, %v", ref.String(), again, err)
			}
		})
	}
}

func TestRunIDFor(t *testing.T) {
	// Pinned values: a request id names one Run forever, across releases.
	golden := map[string]string{
		"req-1": "r-9456bdfa12ea76959c94a357",
		"":      "r-e3b0c44298fc1c149afbf4c8",
	}
	for in, want := range golden {
		if got := schemas.RunIDFor(schemas.DefaultTenant, in); got != want {
			t.Errorf("RunIDFor(default, %q) = %q, want %q", in, got, want)
		}
	}
	// Another tenant's ids hash the tenant too: the same request id in two
	// tenants names two Runs.
	if got, want := schemas.RunIDFor("acme", "req-1"), "r-a634b5907553fbb5286c1d7b"; got != want {
		t.Errorf("RunIDFor(acme, req-1) = %q, want %q", got, want)
	}
	seen := map[string]string{}
	for i := range 3 * 2000 {
		id := fmt.Sprintf("req-%d", i/3)
		tenant := []string{schemas.DefaultTenant, "acme", "beta"}[i%3]
		a, b := schemas.RunIDFor(tenant, id), schemas.RunIDFor(tenant, id)
		if a != b {
			t.Fatalf("RunIDFor(%q) not deterministic: %q vs %q", id, a, b)
		}
		if len(a) != 2+24 || !strings.HasPrefix(a, "r-") {
			t.Fatalf("RunIDFor(%q) = %q, want r-<24 hex>", id, a)
		}
		if err := schemas.ValidateID("run_id", a, schemas.CodeInvalidRunID); err != nil {
			t.Fatalf("RunIDFor(%q) = %q is not a valid id: %v", id, a, err)
		}
		if prev, dup := seen[a]; dup {
			t.Fatalf("RunIDFor(%s/%s) = RunIDFor(%s) = %q", tenant, id, prev, a)
		}
		seen[a] = tenant + "/" + id
	}
}

func TestValidateID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		code schemas.Code
	}{
		{"a", ""},
		{"0", ""},
		{"A.b_c:d-e", ""},
		{strings.Repeat("x", 128), ""},
		{"", schemas.CodeMissingField},
		{strings.Repeat("x", 129), schemas.CodeInvalidRunID},
		{".a", schemas.CodeInvalidRunID},
		{"_a", schemas.CodeInvalidRunID},
		{"a>", schemas.CodeInvalidRunID},
		{"a b", schemas.CodeInvalidRunID},
		{"a\x00", schemas.CodeInvalidRunID},
	} {
		err := schemas.ValidateID("f", tc.id, schemas.CodeInvalidRunID)
		if tc.code == "" {
			if err != nil {
				t.Errorf("ValidateID(%q) = %v", tc.id, err)
			}
			continue
		}
		if !errors.Is(err, &schemas.Refusal{Code: tc.code, Field: "f"}) {
			t.Errorf("ValidateID(%q) = %v, want %s on f", tc.id, err, tc.code)
		}
	}
}

func TestRefusalIs(t *testing.T) {
	r := &schemas.Refusal{Code: schemas.CodeInvalidEnv, Field: "env.K", Reason: "bad"}
	wrapped := fmt.Errorf("submit: %w", r)
	for _, tc := range []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"same code", r, &schemas.Refusal{Code: schemas.CodeInvalidEnv}, true},
		{"same code and field", r, &schemas.Refusal{Code: schemas.CodeInvalidEnv, Field: "env.K"}, true},
		{"reason is ignored", r, &schemas.Refusal{Code: schemas.CodeInvalidEnv, Reason: "other"}, true},
		{"other field", r, &schemas.Refusal{Code: schemas.CodeInvalidEnv, Field: "env"}, false},
		{"other code", r, &schemas.Refusal{Code: schemas.CodeInvalidLabel}, false},
		{"field without code", r, &schemas.Refusal{Field: "env.K"}, false},
		{"wrapped", wrapped, &schemas.Refusal{Code: schemas.CodeInvalidEnv}, true},
		{"wrapped other code", wrapped, &schemas.Refusal{Code: schemas.CodeMalformed}, false},
		{"itself", r, r, true},
		{"not a refusal target", r, errors.New("invalid_env"), false},
		{"plain error", errors.New("invalid_env"), &schemas.Refusal{Code: schemas.CodeInvalidEnv}, false},
		{"refusal without field vs field target", &schemas.Refusal{Code: schemas.CodeMalformed}, &schemas.Refusal{Code: schemas.CodeMalformed, Field: "x"}, false},
	} {
		if got := errors.Is(tc.err, tc.target); got != tc.want {
			t.Errorf("%s: errors.Is = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRefusalErrorAndAsRefusal(t *testing.T) {
	if got := (&schemas.Refusal{Code: "c", Field: "f", Reason: "why"}).Error(); got != `c: field "f": why` {
		t.Errorf("Error() = %q", got)
	}
	if got := (&schemas.Refusal{Code: "c", Reason: "why"}).Error(); got != `c: why` {
		t.Errorf("Error() = %q", got)
	}

	r := &schemas.Refusal{Code: schemas.CodeNoCapacity, Reason: "full"}
	if got := schemas.AsRefusal(fmt.Errorf("x: %w", r)); got != r {
		t.Errorf("AsRefusal(wrapped) = %+v, want the refusal itself", got)
	}
	got := schemas.AsRefusal(errors.New("boom"))
	if got.Code != schemas.CodeInternal || got.Reason != "boom" || got.Field != "" {
		t.Errorf("AsRefusal(plain) = %+v", got)
	}

	// A refusal is itself a wire value.
	b, err := json.Marshal(&schemas.Refusal{Code: schemas.CodeInvalidEnv, Field: "env.K", Reason: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"code":"invalid_env","field":"env.K","reason":"r"}` {
		t.Errorf("refusal json = %s", b)
	}
	b, _ = json.Marshal(&schemas.Refusal{Code: schemas.CodeMalformed, Reason: "r"})
	if string(b) != `{"code":"malformed_payload","reason":"r"}` {
		t.Errorf("refusal json without field = %s", b)
	}
}

func TestResourcesArithmetic(t *testing.T) {
	a := schemas.Resources{CPUMillis: 1000, MemoryBytes: 4 << 30, GPUCount: 2}
	b := schemas.Resources{CPUMillis: 250, MemoryBytes: 1 << 30, GPUCount: 1}
	if got := a.Sub(b); got != (schemas.Resources{CPUMillis: 750, MemoryBytes: 3 << 30, GPUCount: 1}) {
		t.Errorf("Sub = %+v", got)
	}
	if got := a.Sub(b).Add(b); got != a {
		t.Errorf("Sub then Add = %+v", got)
	}
	if !b.Fits(a) || a.Fits(b) || !a.Fits(a) || !(schemas.Resources{}).Fits(schemas.Resources{}) {
		t.Error("Fits is wrong")
	}
	if (schemas.Resources{GPUCount: 1}).Fits(schemas.Resources{CPUMillis: 1 << 20, MemoryBytes: 1 << 40}) {
		t.Error("a GPU request fits a node without GPUs")
	}
}
