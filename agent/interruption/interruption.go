// Package interruption owns a node's own view of spot reclamation: the
// sources an agent watches for its provider's notice that the machine is
// being taken back (a file some host service writes, or a metadata URL the
// provider serves), read into a schemas.InterruptionNotice.
package interruption

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// Source is one place a notice may appear. Check answers nil while there
// is none; an error is a failed look (the next one may succeed), never a
// notice.
type Source interface {
	Check(ctx context.Context) (*schemas.InterruptionNotice, error)
}

// File watches a path: the notice is the file existing, its content the
// detail (an RFC 3339 time on its first line, when there is one, is when
// the machine goes).
type File string

// Check reads the file.
func (f File) Check(context.Context) (*schemas.InterruptionNotice, error) {
	b, err := readAtMost(func() (io.ReadCloser, error) { return os.Open(string(f)) })
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("interruption notice file: %w", err)
	}
	return notice("file", b), nil
}

// URL polls a provider's metadata endpoint: 404 (AWS's
// spot/instance-action before a notice), or a body of FALSE (GCE's
// instance/preempted), is no notice; any other 2xx body is one. Header is
// sent with each look (GCE wants Metadata-Flavor: Google).
type URL struct {
	Address string
	Header  http.Header
	Client  *http.Client
}

// Check asks once.
func (u URL) Check(ctx context.Context) (*schemas.InterruptionNotice, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.Address, nil)
	if err != nil {
		return nil, fmt.Errorf("interruption notice url: %w", err)
	}
	for k, vs := range u.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	client := u.Client
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("interruption notice url: %w", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, fmt.Errorf("interruption notice url: status %d", resp.StatusCode)
	}
	b, err := readAtMost(func() (io.ReadCloser, error) { return io.NopCloser(resp.Body), nil })
	if err != nil {
		return nil, fmt.Errorf("interruption notice url: %w", err)
	}
	if t := strings.TrimSpace(string(b)); strings.EqualFold(t, "false") {
		return nil, nil
	}
	return notice("url", b), nil
}

// readAtMost reads at most schemas.MaxNoticeBytes of what open opens.
func readAtMost(open func() (io.ReadCloser, error)) ([]byte, error) {
	r, err := open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, schemas.MaxNoticeBytes))
}

// notice reads a notice's text: a time when it names one (a bare RFC 3339
// line, or AWS's {"action": …, "time": "…"}), and the text as detail,
// valid UTF-8 only.
func notice(source string, b []byte) *schemas.InterruptionNotice {
	text := strings.ToValidUTF8(strings.TrimSpace(string(b)), "?")
	if len(text) > schemas.MaxNoticeBytes {
		text = text[:schemas.MaxNoticeBytes]
		text = strings.ToValidUTF8(text, "")
	}
	n := &schemas.InterruptionNotice{Source: source, Detail: text}
	for _, field := range strings.FieldsFunc(text, func(r rune) bool { return r == '"' || r == '\n' || r == ',' || r == ' ' || r == '{' || r == '}' }) {
		if t, err := time.Parse(time.RFC3339, field); err == nil {
			n.At = t.UTC()
			break
		}
	}
	return n
}
