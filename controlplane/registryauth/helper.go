package registryauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// Errors of a credential helper, matched with errors.Is. Their messages
// name the helper and what happened, never what it printed: a helper's
// output may hold the secret.
var (
	// ErrHelperFailed: the helper is not on PATH, or exited non-zero.
	ErrHelperFailed = errors.New("credential helper failed")
	// ErrHelperTimedOut: the helper did not answer within its timeout and
	// was killed (with every process it started).
	ErrHelperTimedOut = errors.New("credential helper timed out")
	// ErrHelperOutput: the helper's answer is not the protocol's JSON, has
	// no secret, or is larger than MaxHelperOutput.
	ErrHelperOutput = errors.New("credential helper answered garbage")
	// errNotFound: the helper holds nothing for the registry.
	errNotFound = errors.New("credential helper holds no credential for the registry")
)

// Defaults of a HelperRunner.
const (
	DefaultHelperTimeout = 10 * time.Second
	// MaxHelperOutput bounds what a helper may print: an answer is a few
	// hundred bytes (an ECR token about 2 KiB).
	MaxHelperOutput = 64 << 10
)

// helperNotFound is what the Docker credential helpers print (and exit 1
// with) when they hold nothing for a server URL.
const helperNotFound = "credentials not found in native keychain"

// HelperRunner runs Docker credential helpers with the standard protocol:
// `docker-credential-<name> get`, the registry's server URL on stdin, and
// {"ServerURL", "Username", "Secret"} on stdout.
type HelperRunner struct {
	// Timeout bounds one run; DefaultHelperTimeout when zero.
	Timeout time.Duration
}

// helperAnswer is the protocol's answer.
type helperAnswer struct {
	ServerURL string `json:"ServerURL"`
	Username  string `json:"Username"`
	Secret    string `json:"Secret"`
}

// HelperBinary is the executable a helper name stands for.
func HelperBinary(name string) string { return "docker-credential-" + name }

// Get runs helper name for registry. An answer whose Username is
// "<token>" carries an identity token (returned with no username).
func (h HelperRunner) Get(ctx context.Context, name, registry string) (StaticCredential, error) {
	bin := HelperBinary(name)
	path, err := exec.LookPath(bin)
	if err != nil {
		return StaticCredential{}, fmt.Errorf("%w: %s (for %s) is not on the control plane's PATH; install it or drop it from the configuration", ErrHelperFailed, bin, registry)
	}
	timeout := h.Timeout
	if timeout <= 0 {
		timeout = DefaultHelperTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(rctx, path, "get")
	cmd.Stdin = strings.NewReader(serverURL(registry))
	out := &cappedBuffer{max: MaxHelperOutput}
	cmd.Stdout = out // stderr is dropped: it is never shown anyway
	// A helper may start processes of its own (a shell script, a
	// browser-based login): all of them go with it on a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	switch {
	case ctx.Err() != nil:
		return StaticCredential{}, fmt.Errorf("credential helper %s for %s: %w", bin, registry, ctx.Err())
	case out.over:
		return StaticCredential{}, fmt.Errorf("%w: %s printed more than %d bytes for %s", ErrHelperOutput, bin, MaxHelperOutput, registry)
	case rctx.Err() != nil:
		return StaticCredential{}, fmt.Errorf("%w: %s gave no answer for %s within %s and was killed", ErrHelperTimedOut, bin, registry, timeout)
	case err != nil:
		if strings.TrimSpace(out.buf.String()) == helperNotFound {
			return StaticCredential{}, errNotFound
		}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return StaticCredential{}, fmt.Errorf("%w: %s exited with status %d for %s (its output is not shown: it may hold a secret); run `%s get` by hand to see why",
				ErrHelperFailed, bin, exit.ExitCode(), registry, bin)
		}
		return StaticCredential{}, fmt.Errorf("%w: run %s: %w", ErrHelperFailed, bin, err)
	}
	var a helperAnswer
	if err := json.Unmarshal(out.buf.Bytes(), &a); err != nil {
		return StaticCredential{}, fmt.Errorf("%w: %s answered for %s with something other than the helper protocol's JSON", ErrHelperOutput, bin, registry)
	}
	if a.Secret == "" {
		return StaticCredential{}, fmt.Errorf("%w: %s answered for %s with no Secret", ErrHelperOutput, bin, registry)
	}
	if a.Username == "<token>" || a.Username == "" {
		return StaticCredential{IdentityToken: a.Secret}, nil
	}
	return StaticCredential{Username: a.Username, Password: a.Secret}, nil
}

// serverURL is what a helper is asked for: Docker Hub is known to helpers
// by its index URL, every other registry by its host.
func serverURL(registry string) string {
	if registry == schemas.DockerHubRegistry {
		return "https://index.docker.io/v1/"
	}
	return registry
}

// cappedBuffer keeps up to max bytes. Past them it notes the overflow and
// fails the write, which closes the helper's stdout: a helper that goes on
// writing dies of SIGPIPE, or at its timeout.
// It holds its buffer in a field, not embedded: an embedded bytes.Buffer's
// ReadFrom would let io.Copy bypass the cap.
type cappedBuffer struct {
	buf  bytes.Buffer
	max  int
	over bool
}

var errOutputTooLarge = errors.New("output too large")

func (c *cappedBuffer) Write(b []byte) (int, error) {
	if len(b) > c.max-c.buf.Len() {
		c.over = true
		return 0, errOutputTooLarge
	}
	return c.buf.Write(b)
}
