package registryauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/warmfleet/warmfleet/schemas"
)

// MaxConfigBytes bounds a credentials file: a Docker config.json is a few
// kilobytes.
const MaxConfigBytes = 1 << 20

// ErrMalformedConfig matches every *ConfigError.
var ErrMalformedConfig = errors.New("malformed registry credentials file")

// ConfigError says where a credentials file is wrong: the line and column
// (both from 1) of the value at fault, the field, and what to do. It never
// quotes a credential.
type ConfigError struct {
	Path         string
	Line, Column int
	Field        string
	Reason       string
}

func (e *ConfigError) Error() string {
	where := fmt.Sprintf("line %d, column %d", e.Line, e.Column)
	if e.Path != "" {
		where = e.Path + ": " + where
	}
	if e.Field == "" {
		return fmt.Sprintf("registry credentials file %s: %s", where, e.Reason)
	}
	return fmt.Sprintf("registry credentials file %s: %s: %s", where, e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrMalformedConfig) match.
func (e *ConfigError) Is(target error) bool { return target == ErrMalformedConfig }

// DockerConfig is what the control plane takes from a Docker
// config.json: static credentials and credential helpers, keyed by
// canonical registry host (schemas.CanonicalRegistry). Other keys of the
// file (proxies, plugins, formats) are ignored.
type DockerConfig struct {
	Auths       map[string]StaticCredential
	CredHelpers map[string]string // registry → helper name (docker-credential-<name>)
	CredsStore  string            // helper for every registry without another source
}

// StaticCredential is a credential written in the file: a user and
// password, or an identity token.
type StaticCredential struct {
	Username, Password, IdentityToken string
}

// helperName is a credential helper's suffix: a name, never a path.
var helperName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// registryHost is a canonical registry host[:port].
var registryHost = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$|^\[[0-9a-f:]+\](:[0-9]{1,5})?$`)

// LoadConfig reads and parses a Docker config.json-format file.
func LoadConfig(path string) (*DockerConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("registry credentials file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("registry credentials file %s: %w", path, err)
	}
	cfg, err := ParseConfig(data)
	var ce *ConfigError
	if errors.As(err, &ce) {
		ce.Path = path
	}
	return cfg, err
}

// ParseConfig parses a Docker config.json: "auths" (registry → {"auth":
// base64 of user:password} or {"username", "password"} or
// {"identitytoken"}), "credHelpers" (registry → helper name) and
// "credsStore". Anything malformed is a *ConfigError naming its line and
// column.
func ParseConfig(data []byte) (*DockerConfig, error) {
	p := &parser{data: data}
	if len(data) > MaxConfigBytes {
		return nil, p.errAt(0, "", "the file is larger than %d bytes; a Docker config.json is a few kilobytes", MaxConfigBytes)
	}
	p.dec = json.NewDecoder(bytes.NewReader(data))
	p.dec.UseNumber()
	cfg := &DockerConfig{Auths: map[string]StaticCredential{}, CredHelpers: map[string]string{}}
	if err := p.object("", func(key string, at int) error {
		switch key {
		case "auths":
			return p.auths(cfg)
		case "credHelpers":
			return p.credHelpers(cfg)
		case "credsStore":
			v, at, err := p.str("credsStore")
			if err != nil {
				return err
			}
			if v != "" && !helperName.MatchString(v) {
				return p.errAt(at, "credsStore", "must name a credential helper (docker-credential-<name>): letters, digits, '.', '_', '-'")
			}
			cfg.CredsStore = v
			return nil
		}
		return p.skip()
	}); err != nil {
		return nil, err
	}
	if at := p.next(); at < len(p.data) {
		return nil, p.errAt(at, "", "unexpected data after the top-level object")
	}
	return cfg, nil
}

func (p *parser) auths(cfg *DockerConfig) error {
	seen := map[string]int{}
	return p.object("auths", func(key string, at int) error {
		host, err := p.host("auths", key, at, seen)
		if err != nil {
			return err
		}
		field := "auths." + key
		var c StaticCredential
		var auth string
		authAt := 0
		if err := p.object(field, func(k string, _ int) error {
			switch k {
			case "auth", "username", "password", "identitytoken":
				v, vat, err := p.str(field + "." + k)
				if err != nil {
					return err
				}
				switch k {
				case "auth":
					auth, authAt = v, vat
				case "username":
					c.Username = v
				case "password":
					c.Password = v
				case "identitytoken":
					c.IdentityToken = v
				}
				return nil
			}
			return p.skip() // email, serveraddress, registrytoken: not used for pulls
		}); err != nil {
			return err
		}
		if auth != "" {
			raw, err := base64.StdEncoding.DecodeString(auth)
			if err != nil {
				return p.errAt(authAt, field+".auth", "is not standard base64; write base64 of user:password (e.g. printf 'user:password' | base64 -w0)")
			}
			user, pass, ok := strings.Cut(string(raw), ":")
			if !ok || user == "" {
				return p.errAt(authAt, field+".auth", "does not decode to user:password; write base64 of user:password")
			}
			c.Username, c.Password = user, pass
		}
		switch {
		case c.Username != "" && c.Password == "":
			return p.errAt(at, field, "has a username without a password; add \"password\" or use \"auth\"")
		case c.Username == "" && c.Password != "":
			return p.errAt(at, field, "has a password without a username; add \"username\" or use \"auth\"")
		case c.Username == "" && c.IdentityToken == "":
			return nil // a placeholder for credsStore, as docker login writes one
		}
		cfg.Auths[host] = c
		return nil
	})
}

func (p *parser) credHelpers(cfg *DockerConfig) error {
	seen := map[string]int{}
	return p.object("credHelpers", func(key string, at int) error {
		host, err := p.host("credHelpers", key, at, seen)
		if err != nil {
			return err
		}
		v, vat, err := p.str("credHelpers." + key)
		if err != nil {
			return err
		}
		if !helperName.MatchString(v) {
			return p.errAt(vat, "credHelpers."+key, "must name a credential helper (docker-credential-<name>): letters, digits, '.', '_', '-'")
		}
		cfg.CredHelpers[host] = v
		return nil
	})
}

// host checks a registry key and that no other key of the object names the
// same registry.
func (p *parser) host(field, key string, at int, seen map[string]int) (string, error) {
	host := schemas.CanonicalRegistry(key)
	if !registryHost.MatchString(host) {
		return "", p.errAt(at, field, "key %q is not a registry host[:port] (e.g. registry.example.com or https://index.docker.io/v1/)", key)
	}
	if prev, ok := seen[host]; ok {
		line, _ := p.lineCol(prev)
		return "", p.errAt(at, field, "key %q names registry %s again (also on line %d); keep one", key, host, line)
	}
	seen[host] = at
	return host, nil
}

// parser walks a JSON document token by token, knowing where each value
// starts, so that an error can name its line and column.
type parser struct {
	data []byte
	dec  *json.Decoder
}

// next is the offset where the next token starts.
func (p *parser) next() int {
	i := int(p.dec.InputOffset())
	for i < len(p.data) && strings.IndexByte(" \t\r\n,:", p.data[i]) >= 0 {
		i++
	}
	return i
}

func (p *parser) lineCol(off int) (int, int) {
	off = min(max(off, 0), len(p.data))
	line := 1 + bytes.Count(p.data[:off], []byte{'\n'})
	col := 1 + off - (bytes.LastIndexByte(p.data[:off], '\n') + 1)
	return line, col
}

func (p *parser) errAt(off int, field, format string, args ...any) *ConfigError {
	line, col := p.lineCol(off)
	return &ConfigError{Line: line, Column: col, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// token reads one token and where it started; a syntax error is a
// *ConfigError at the offending byte.
func (p *parser) token() (json.Token, int, error) {
	at := p.next()
	t, err := p.dec.Token()
	if err == nil {
		return t, at, nil
	}
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		// A Decoder's offsets are not always absolute; a whole-document
		// check's are (one past the offending byte).
		var whole *json.SyntaxError
		if errors.As(json.Unmarshal(p.data, new(any)), &whole) {
			se = whole
		}
		return nil, at, p.errAt(int(se.Offset)-1, "", "not valid JSON: %s", se.Error())
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return nil, at, p.errAt(len(p.data), "", "the file ends inside a value; it is cut short")
	}
	return nil, at, p.errAt(at, "", "not valid JSON: %s", err.Error())
}

// object reads an object, calling each for every key with the value next.
func (p *parser) object(field string, each func(key string, at int) error) error {
	t, at, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		if field == "" {
			return p.errAt(at, "", "the file must hold one JSON object, like a Docker config.json")
		}
		return p.errAt(at, field, "must be an object")
	}
	for {
		t, at, err := p.token()
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok && d == '}' {
			return nil
		}
		key, _ := t.(string) // the decoder only yields string keys
		if err := each(key, at); err != nil {
			return err
		}
	}
}

// str reads a string value.
func (p *parser) str(field string) (string, int, error) {
	t, at, err := p.token()
	if err != nil {
		return "", at, err
	}
	s, ok := t.(string)
	if !ok {
		if _, isDelim := t.(json.Delim); isDelim {
			if err := p.skipRest(); err != nil {
				return "", at, err
			}
		}
		return "", at, p.errAt(at, field, "must be a string")
	}
	return s, at, nil
}

// skip reads one value of any kind.
func (p *parser) skip() error {
	t, _, err := p.token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); ok && (d == '{' || d == '[') {
		return p.skipRest()
	}
	return nil
}

// skipRest reads to the end of an object or array whose opening
// delimiter was read.
func (p *parser) skipRest() error {
	for depth := 1; depth > 0; {
		t, _, err := p.token()
		if err != nil {
			return err
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
	return nil
}
