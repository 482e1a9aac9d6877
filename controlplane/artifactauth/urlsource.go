package artifactauth

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"sort"
	"strings"
)

// URLSource holds the headers the control plane sends with fetches of
// URL-sourced artifacts (`warmfleet serve --artifact-source-auth FILE`).
// The file has one header per line:
//
//	# comment
//	<url-prefix> <Header-Name>: <value>
//	https://models.example.com/ Authorization: Bearer xyz
//
// A prefix is an http(s) URL with a host and a path (at least "/"), no
// userinfo, query or fragment. A prefix may have several lines, one per
// header. A fetch gets the headers of the longest prefix its URL starts
// with, or none. Errors name the line and column, never a value.
type URLSource struct {
	entries []urlEntry // longest prefix first
}

type urlEntry struct {
	prefix  string
	headers map[string]string
}

// maxSourceFile bounds the file read at start.
const maxSourceFile = 1 << 20

// LoadURLSource reads and parses the file at path.
func LoadURLSource(path string) (*URLSource, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("artifact source auth: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSourceFile+1))
	if err != nil {
		return nil, fmt.Errorf("artifact source auth %s: %w", path, err)
	}
	if len(b) > maxSourceFile {
		return nil, fmt.Errorf("artifact source auth %s: larger than %d bytes", path, maxSourceFile)
	}
	s, err := ParseURLSource(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// SourceSyntaxError is a malformed line of the file. It names the line,
// the column and what is wrong, never the value.
type SourceSyntaxError struct {
	Line, Column int
	Reason       string
}

func (e *SourceSyntaxError) Error() string {
	return fmt.Sprintf("artifact source auth: line %d, column %d: %s", e.Line, e.Column, e.Reason)
}

// ParseURLSource parses the file's text.
func ParseURLSource(text string) (*URLSource, error) {
	byPrefix := map[string]map[string]string{}
	for i, line := range strings.Split(text, "\n") {
		ln := i + 1
		line = strings.TrimSuffix(line, "\r")
		col := len(line) - len(strings.TrimLeft(line, " \t")) + 1
		rest := strings.TrimLeft(line, " \t")
		if rest == "" || strings.HasPrefix(rest, "#") {
			continue
		}
		fail := func(c int, format string, args ...any) error {
			return &SourceSyntaxError{Line: ln, Column: c, Reason: fmt.Sprintf(format, args...)}
		}
		sp := strings.IndexAny(rest, " \t")
		if sp < 0 {
			return nil, fail(col, "want `<url-prefix> <Header-Name>: <value>`")
		}
		prefix := rest[:sp]
		if err := checkPrefix(prefix); err != "" {
			return nil, fail(col, "the URL prefix %s", err)
		}
		after := rest[sp:]
		hcol := col + sp + (len(after) - len(strings.TrimLeft(after, " \t")))
		after = strings.TrimLeft(after, " \t")
		colon := strings.IndexByte(after, ':')
		if colon <= 0 {
			return nil, fail(hcol, "want a header `Name: value` after the URL prefix")
		}
		name := after[:colon]
		if !validHeaderName(name) {
			return nil, fail(hcol, "a header name is letters, digits and !#$%%&'*+-.^_`|~, followed by a colon")
		}
		vcol := hcol + colon + 1
		value := after[colon+1:]
		vcol += len(value) - len(strings.TrimLeft(value, " \t"))
		value = strings.TrimSpace(value)
		if value == "" {
			return nil, fail(vcol, "header %s has no value", name)
		}
		if c := badValueByte(value); c >= 0 {
			return nil, fail(vcol+c, "header %s's value holds a control character", name)
		}
		canon := canonicalHeader(name)
		h := byPrefix[prefix]
		if h == nil {
			h = map[string]string{}
			byPrefix[prefix] = h
		}
		if _, dup := h[canon]; dup {
			return nil, fail(hcol, "header %s is given twice for %s", canon, prefix)
		}
		h[canon] = value
	}
	s := &URLSource{}
	for p, h := range byPrefix {
		s.entries = append(s.entries, urlEntry{prefix: p, headers: h})
	}
	sort.Slice(s.entries, func(i, j int) bool {
		if len(s.entries[i].prefix) != len(s.entries[j].prefix) {
			return len(s.entries[i].prefix) > len(s.entries[j].prefix)
		}
		return s.entries[i].prefix < s.entries[j].prefix
	})
	return s, nil
}

// checkPrefix says what is wrong with a URL prefix, or "".
func checkPrefix(p string) string {
	u, err := url.Parse(p)
	switch {
	case err != nil || len(p) > 2048:
		return "is not a URL of at most 2048 bytes"
	case u.Scheme != "http" && u.Scheme != "https":
		return "must start with http:// or https://"
	case u.Host == "":
		return "needs a host"
	case u.User != nil:
		return "must not carry userinfo; put the credential in a header"
	case u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(p, "?#"):
		return "must not carry a query or fragment"
	case !strings.HasPrefix(u.Path, "/"):
		// Without it, https://a.example matches https://a.example.evil.org.
		return "must have a path after the host, at least /"
	}
	return ""
}

// validHeaderName: an HTTP token (RFC 9110, tchar).
func validHeaderName(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// badValueByte returns the offset of the first control byte (tab allowed),
// or -1.
func badValueByte(v string) int {
	for i, c := range []byte(v) {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return i
		}
	}
	return -1
}

// canonicalHeader is the MIME canonical form (content-type → Content-Type).
func canonicalHeader(s string) string {
	b := []byte(s)
	upper := true
	for i, c := range b {
		switch {
		case upper && c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		case !upper && c >= 'A' && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
		upper = c == '-'
	}
	return string(b)
}

// Headers returns a copy of the headers for rawURL: those of the longest
// prefix it starts with; nil when none matches (anonymous).
func (s *URLSource) Headers(rawURL string) map[string]string {
	if s == nil {
		return nil
	}
	for _, e := range s.entries {
		if strings.HasPrefix(rawURL, e.prefix) {
			out := make(map[string]string, len(e.headers))
			for k, v := range e.headers {
				out[k] = v
			}
			return out
		}
	}
	return nil
}

// Prefixes lists the configured prefixes, longest first (for logs: never
// the headers' values).
func (s *URLSource) Prefixes() []string {
	if s == nil {
		return nil
	}
	out := make([]string, len(s.entries))
	for i, e := range s.entries {
		out[i] = e.prefix
	}
	return out
}
