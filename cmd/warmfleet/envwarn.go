package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// secretLikeEnv are the names of env, sorted, that look like they hold a
// secret: *_TOKEN, *_KEY, *PASSWORD*, *SECRET*, in any case.
func secretLikeEnv(env map[string]string) []string {
	var out []string
	for name := range env {
		u := strings.ToUpper(name)
		if strings.HasSuffix(u, "_TOKEN") || strings.HasSuffix(u, "_KEY") || strings.Contains(u, "PASSWORD") || strings.Contains(u, "SECRET") {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// warnSecretEnv tells, on w, that plain env is stored in the clear when a
// name in env looks like a secret. It names the variables, never a value.
func warnSecretEnv(w io.Writer, env map[string]string) {
	names := secretLikeEnv(env)
	if len(names) == 0 {
		return
	}
	fmt.Fprintf(w, "warmfleet: warning: env %s looks like a secret; plain env is stored with the Run and visible to your tenant's producers and operators. "+
		"Store it with `warmfleet secret set NAME` and reference it in \"secret_env\": [{\"name\": \"%s\", \"secret\": \"NAME\"}] instead (docs/security.md, Secrets)\n",
		strings.Join(names, ", "), names[0])
}
