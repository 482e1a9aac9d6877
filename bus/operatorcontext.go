package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go"
)

// OperatorContextFile is the file `warmfleet serve --auth` (embedded)
// writes in its data dir: the operator's login, which the `warmfleet` CLI
// finds on its own and the stock `nats` CLI reads through
// NATS_CONTEXT=<path>.
const OperatorContextFile = "operator.json"

// OperatorContext is the operator's login, in the `nats` CLI's context
// format (the fields warmfleet uses). It holds the operator token: the file
// is 0600, and it is never logged.
type OperatorContext struct {
	Description string `json:"description,omitempty"`
	URL         string `json:"url"`
	User        string `json:"user"`
	Password    string `json:"password"`
	// CA is the path of the PEM CA the server's certificate chains to.
	CA string `json:"ca,omitempty"`
	// Cert and Key are a client certificate's files, for a server that
	// verifies clients.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
}

// ErrOperatorContext is wrapped by every error reading one.
var ErrOperatorContext = errors.New("bus: operator context")

// WriteOperatorContext writes c to path, 0600, replacing any file there
// in one rename.
func WriteOperatorContext(path string, c OperatorContext) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".operator-*.json")
	if err != nil {
		return fmt.Errorf("%w: %w", ErrOperatorContext, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("%w: write %s: %w", ErrOperatorContext, path, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("%w: %w", ErrOperatorContext, err)
	}
	return nil
}

// ReadOperatorContext reads the file at path. A file others may read is
// refused: it holds the operator token.
func ReadOperatorContext(path string) (OperatorContext, error) {
	var c OperatorContext
	st, err := os.Stat(path)
	if err != nil {
		return c, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return c, fmt.Errorf("%w: %s is mode %v; it holds the operator token: chmod 600 it", ErrOperatorContext, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%w: %s: not JSON: %w", ErrOperatorContext, path, err)
	}
	if c.URL == "" || c.User == "" || c.Password == "" {
		return c, fmt.Errorf("%w: %s needs url, user and password", ErrOperatorContext, path)
	}
	return c, nil
}

// Options are the connection options of this login: TLS against its CA
// when it names one, and the operator's credentials.
func (c OperatorContext) Options() ([]nats.Option, error) {
	opts, err := TLSFiles{CAFile: c.CA, CertFile: c.Cert, KeyFile: c.Key}.ClientOptions()
	if err != nil {
		return nil, err
	}
	creds := OperatorCredentials(c.Password)
	if c.User != OperatorUser {
		creds = &Credentials{user: c.User, secret: c.Password}
	}
	return append(opts, creds.Options()...), nil
}

// EnvHasLogin reports whether the environment names a login
// (WARMFLEET_NATS_TOKEN_FILE or WARMFLEET_NATS_TOKEN), which then wins over
// any operator context file.
func EnvHasLogin() bool {
	return os.Getenv(EnvNATSTokenFile) != "" || os.Getenv(envNATSTokenValue) != ""
}
