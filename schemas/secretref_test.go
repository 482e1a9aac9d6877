package schemas_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/bus/codec"
	"github.com/warmfleet/warmfleet/schemas"
)

// TestRunRequestSecretRefs: every bad secret reference is refused with its
// code, naming the field by its index.
func TestRunRequestSecretRefs(t *testing.T) {
	valid := func() schemas.RunRequest {
		return schemas.RunRequest{RequestID: "r", Image: testImage, Env: map[string]string{"PLAIN": "x"},
			SecretEnv:   []schemas.SecretEnvRef{{Name: "API_TOKEN", Secret: "api-token"}},
			SecretFiles: []schemas.SecretFileRef{{Secret: "tls", Path: "/run/secrets/tls.key"}, {Secret: "tls", Path: "/etc/app/key", Mode: 0o440}},
			Caches:      []schemas.CacheMount{{Name: "c", Path: "/cache"}}}
	}
	r := valid()
	if err := r.Validate(); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	many := make([]schemas.SecretFileRef, schemas.MaxSecretRefs)
	for i := range many {
		many[i] = schemas.SecretFileRef{Secret: "s", Path: fmt.Sprintf("/run/s%d", i)}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*schemas.RunRequest)
		code  schemas.Code
		field string
	}{
		{"relative path", func(r *schemas.RunRequest) { r.SecretFiles[1].Path = "etc/app/key" }, schemas.CodeInvalidSecretPath, "secret_files[1].path"},
		{"path with ..", func(r *schemas.RunRequest) { r.SecretFiles[1].Path = "/etc/../../key" }, schemas.CodeInvalidSecretPath, "secret_files[1].path"},
		{"trailing slash", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/run/secrets/" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"root", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"under proc", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/proc/1/environ" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"under dev", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/dev/shm/k" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"sys itself", func(r *schemas.RunRequest) { r.SecretFiles[0].Path = "/sys" }, schemas.CodeInvalidSecretPath, "secret_files[0].path"},
		{"duplicate path", func(r *schemas.RunRequest) { r.SecretFiles[1].Path = "/run/secrets/tls.key" }, schemas.CodeInvalidSecretPath, "secret_files[1].path"},
		{"cache path", func(r *schemas.RunRequest) { r.SecretFiles[1].Path = "/cache" }, schemas.CodeInvalidSecretPath, "secret_files[1].path"},
		{"missing path", func(r *schemas.RunRequest) { r.SecretFiles[1].Path = "" }, schemas.CodeMissingField, "secret_files[1].path"},
		{"setuid", func(r *schemas.RunRequest) { r.SecretFiles[1].Mode = 0o4755 }, schemas.CodeInvalidSecretMode, "secret_files[1].mode"},
		{"sticky", func(r *schemas.RunRequest) { r.SecretFiles[0].Mode = 0o1400 }, schemas.CodeInvalidSecretMode, "secret_files[0].mode"},
		{"file secret name", func(r *schemas.RunRequest) { r.SecretFiles[0].Secret = "a.b" }, schemas.CodeInvalidSecretName, "secret_files[0].secret"},
		{"env secret name", func(r *schemas.RunRequest) { r.SecretEnv[0].Secret = "" }, schemas.CodeMissingField, "secret_env[0].secret"},
		{"env name", func(r *schemas.RunRequest) { r.SecretEnv[0].Name = "1X" }, schemas.CodeInvalidEnv, "secret_env[0].name"},
		{"env also plain", func(r *schemas.RunRequest) { r.SecretEnv[0].Name = "PLAIN" }, schemas.CodeInvalidEnv, "secret_env[0].name"},
		{"env the node's", func(r *schemas.RunRequest) { r.SecretEnv[0].Name = "WARMFLEET_NODE_ID" }, schemas.CodeInvalidEnv, "secret_env[0].name"},
		{"env twice", func(r *schemas.RunRequest) {
			r.SecretEnv = append(r.SecretEnv, schemas.SecretEnvRef{Name: "API_TOKEN", Secret: "x"})
		}, schemas.CodeInvalidEnv, "secret_env[1].name"},
		{"too many", func(r *schemas.RunRequest) { r.SecretFiles = many }, schemas.CodeTooManyItems, "secret_files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := valid()
			tc.edit(&r)
			var ref *schemas.Refusal
			if err := r.Validate(); !errors.As(err, &ref) || ref.Code != tc.code || ref.Field != tc.field {
				t.Fatalf("Validate = %v, want %s on %s", err, tc.code, tc.field)
			}
		})
	}
}

// TestSecretFileMode: a reference without a mode gets 0400.
func TestSecretFileMode(t *testing.T) {
	if m := (schemas.SecretFileRef{}).FileMode(); m != 0o400 {
		t.Fatalf("default mode %#o", m)
	}
	if m := (schemas.SecretFileRef{Mode: 0o440}).FileMode(); m != 0o440 {
		t.Fatalf("mode %#o", m)
	}
}

// TestSecretValuesBounds: a delivery over its bounds is refused naming the
// field, and no way of printing one shows a value.
func TestSecretValuesBounds(t *testing.T) {
	value := []byte("s3cr3t-value-never-printed")
	v := schemas.SecretValues{Env: []schemas.SecretEnvValue{{Name: "A", Value: value}},
		Files: []schemas.SecretFileValue{{Path: "/run/k", Mode: 0o400, Value: value}}}
	if err := v.Validate(); err != nil {
		t.Fatalf("valid values refused: %v", err)
	}
	for _, s := range []string{v.String(), fmt.Sprintf("%v %+v %#v %s", v, v, v, v), fmt.Sprintf("%v %+v %#v", v.Env, v.Files[0], &v)} {
		if strings.Contains(s, string(value)) {
			t.Fatalf("values print: %s", s)
		}
	}
	big := bytes.Repeat([]byte("x"), schemas.MaxSecretBytes+1)
	for _, tc := range []struct {
		v     schemas.SecretValues
		code  schemas.Code
		field string
	}{
		{schemas.SecretValues{Env: []schemas.SecretEnvValue{{Name: "A", Value: big}}}, schemas.CodeSecretTooLarge, "env[0].value"},
		{schemas.SecretValues{Env: []schemas.SecretEnvValue{{Name: "A", Value: []byte("a\x00b")}}}, schemas.CodeInvalidEnv, "env[0].value"},
		{schemas.SecretValues{Files: []schemas.SecretFileValue{{Path: "/k", Mode: 0o4400}}}, schemas.CodeInvalidSecretMode, "files[0].mode"},
		{schemas.SecretValues{Files: []schemas.SecretFileValue{{Path: "k", Mode: 0o400}}}, schemas.CodeInvalidSecretPath, "files[0].path"},
		{manyFiles(13, schemas.MaxSecretBytes), schemas.CodeSecretTooLarge, ""},
		{manyFiles(schemas.MaxSecretRefs+1, 1), schemas.CodeTooManyItems, ""},
	} {
		var ref *schemas.Refusal
		if err := tc.v.Validate(); !errors.As(err, &ref) || ref.Code != tc.code || ref.Field != tc.field {
			t.Fatalf("Validate(%v) = %v, want %s on %q", tc.v, err, tc.code, tc.field)
		}
	}
}

func manyFiles(n, size int) schemas.SecretValues {
	var v schemas.SecretValues
	for i := range n {
		v.Files = append(v.Files, schemas.SecretFileValue{Path: fmt.Sprintf("/run/s%d", i), Mode: 0o400, Value: make([]byte, size)})
	}
	return v
}

// FuzzSecretRequestDecode: what an agent asks for decodes and validates or
// is refused with a code, and a valid one survives msgpack.
func FuzzSecretRequestDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		var r schemas.SecretRequest
		if !decodeAndValidate(t, contentType, body, &r) {
			return
		}
		if r.FencingToken == 0 || r.RunID == "" || r.AttemptID == "" {
			t.Fatalf("valid secret request without its session or attempt: %+v", r)
		}
		reencode(t, &r)
	})
}

// FuzzSecretValuesDecode: the control plane's answer decodes or is refused
// as malformed; one the agent accepts is within its bounds, survives
// msgpack, and never prints a value.
func FuzzSecretValuesDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		h := fuzzHeader(contentType)
		var rep schemas.Reply[schemas.SecretValues]
		if err := codec.Decode(codec.Detect(h, body), body, &rep); err != nil {
			if !errors.Is(err, codec.ErrMalformed) {
				t.Fatalf("decode error does not match ErrMalformed: %v", err)
			}
			return
		}
		v := rep.OK
		if v == nil || v.Validate() != nil {
			return
		}
		if v.Size() > schemas.MaxSecretValuesBytes {
			t.Fatalf("accepted %d bytes of values", v.Size())
		}
		show := func(v schemas.SecretValues) string {
			return fmt.Sprintf("%v %+v %#v %s %v %v", v, v, v, &v, v.Env, v.Files)
		}
		// What prints with every value blanked is the baseline: a value
		// that is a substring of it (a path, a count) proves nothing.
		blank := schemas.SecretValues{Env: append([]schemas.SecretEnvValue(nil), v.Env...), Files: append([]schemas.SecretFileValue(nil), v.Files...)}
		var values [][]byte
		for i := range blank.Env {
			values = append(values, blank.Env[i].Value)
			blank.Env[i].Value = make([]byte, len(blank.Env[i].Value))
		}
		for i := range blank.Files {
			values = append(values, blank.Files[i].Value)
			blank.Files[i].Value = make([]byte, len(blank.Files[i].Value))
		}
		printed, baseline := show(*v), show(blank)
		for _, val := range values {
			if len(val) >= 8 && !strings.Contains(baseline, string(val)) && strings.Contains(printed, string(val)) {
				t.Fatalf("a value prints: %q", printed)
			}
		}
		reencode(t, v)
	})
}
