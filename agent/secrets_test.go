package agent

import (
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// TestMatchSecrets: an answer is used only when it is exactly the launch's
// references, in order, and a mismatch names no value.
func TestMatchSecrets(t *testing.T) {
	cmd := &schemas.LaunchWorkload{SecretEnv: []schemas.SecretEnvRef{{Name: "A", Secret: "s"}},
		SecretFiles: []schemas.SecretFileRef{{Secret: "s", Path: "/run/k"}}}
	value := []byte("value-never-in-an-error")
	ok := schemas.SecretValues{Env: []schemas.SecretEnvValue{{Name: "A", Value: value}},
		Files: []schemas.SecretFileValue{{Path: "/run/k", Mode: 0o400, Value: value}}}
	if err := matchSecrets(cmd, ok); err != nil {
		t.Fatalf("matching answer refused: %v", err)
	}
	for name, v := range map[string]schemas.SecretValues{
		"missing file": {Env: ok.Env},
		"other name":   {Env: []schemas.SecretEnvValue{{Name: "B", Value: value}}, Files: ok.Files},
		"other path":   {Env: ok.Env, Files: []schemas.SecretFileValue{{Path: "/etc/k", Mode: 0o400, Value: value}}},
		"other mode":   {Env: ok.Env, Files: []schemas.SecretFileValue{{Path: "/run/k", Mode: 0o444, Value: value}}},
	} {
		err := matchSecrets(cmd, v)
		if err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if strings.Contains(err.Error(), string(value)) {
			t.Fatalf("%s: the error shows a value: %v", name, err)
		}
	}
}
