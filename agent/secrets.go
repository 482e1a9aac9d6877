package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/warmfleet/warmfleet/schemas"
)

// secrets asks the control plane, under the node's current session, for
// the values of the secrets the launch references, last before the
// workload starts, and puts them in its spec: held in memory only, for
// the runtime to hand the container. A refusal, or an answer that does not
// match the references, fails the launch secret_unavailable; the error
// names the refusal's reason, never a value.
func (l *launch) secrets(ctx context.Context) error {
	c := l.cmd
	if len(c.SecretEnv) == 0 && len(c.SecretFiles) == 0 {
		return nil
	}
	vals, err := l.a.creds.Secrets(ctx, c.RunID, c.AttemptID)
	if err != nil {
		return failure(schemas.CodeSecretUnavailable, err)
	}
	if err := matchSecrets(c, vals); err != nil {
		return failure(schemas.CodeSecretUnavailable, err)
	}
	l.spec.SecretEnv, l.spec.SecretFiles = vals.Env, vals.Files
	return nil
}

// matchSecrets checks that the control plane answered exactly the
// launch's references, in order: a value is never given a name or path
// the Run did not ask for.
func matchSecrets(c *schemas.LaunchWorkload, vals schemas.SecretValues) error {
	if len(vals.Env) != len(c.SecretEnv) || len(vals.Files) != len(c.SecretFiles) {
		return errors.New("the control plane's secrets do not match the launch's references")
	}
	for i, e := range c.SecretEnv {
		if vals.Env[i].Name != e.Name {
			return fmt.Errorf("the control plane's secret_env[%d] is for %s, not %s", i, vals.Env[i].Name, e.Name)
		}
	}
	for i, f := range c.SecretFiles {
		if vals.Files[i].Path != f.Path || vals.Files[i].Mode != f.FileMode() {
			return fmt.Errorf("the control plane's secret_files[%d] is for %s mode %#o, not %s mode %#o", i, vals.Files[i].Path, vals.Files[i].Mode, f.Path, f.FileMode())
		}
	}
	return nil
}
