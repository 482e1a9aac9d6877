package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestSecretLikeEnv(t *testing.T) {
	env := map[string]string{
		"HF_TOKEN": "v1", "aws_secret_access_key": "v2", "DB_PASSWORD_FILE": "v3", "api_key": "v4", "MY_SECRET": "v5",
		"PATH": "/bin", "TOKENIZER": "x", "KEYBOARD": "us", "MODEL": "llama", "TOKEN_COUNT": "9",
	}
	got := secretLikeEnv(env)
	want := []string{"DB_PASSWORD_FILE", "HF_TOKEN", "MY_SECRET", "api_key", "aws_secret_access_key"}
	if !slices.Equal(got, want) {
		t.Fatalf("secretLikeEnv = %v, want %v", got, want)
	}
	var w bytes.Buffer
	warnSecretEnv(&w, env)
	msg := w.String()
	if !strings.Contains(msg, "HF_TOKEN") || !strings.Contains(msg, "secret_env") || !strings.Contains(msg, "warmfleet secret set") {
		t.Fatalf("warning %q", msg)
	}
	for _, v := range []string{"v1", "v2", "v3", "v4", "v5"} {
		if strings.Contains(msg, `"`+v) || strings.Contains(msg, "="+v) {
			t.Fatalf("warning shows a value: %q", msg)
		}
	}
	w.Reset()
	warnSecretEnv(&w, map[string]string{"PATH": "/bin", "MODEL": "x"})
	if w.Len() != 0 {
		t.Fatalf("warned about %q", w.String())
	}
}
