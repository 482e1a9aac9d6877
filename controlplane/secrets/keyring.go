package secrets

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/crypto/nacl/secretbox"

	"github.com/warmfleet/warmfleet/schemas"
)

// The key file holds one key a line, `<key-id> <base64 of 32 random
// bytes>`; blank lines and lines starting with '#' are skipped. The first
// key seals; every key opens, so a new key is prepended and an old one
// removed only once `warmfleet secret rotate-key` has re-sealed everything
// under the new one.

const (
	keyBytes   = 32
	nonceBytes = 24
	// MaxKeyFileBytes bounds the key file read.
	MaxKeyFileBytes = 64 << 10
	// MaxKeys bounds the keys of one file.
	MaxKeys = 64
)

var (
	// ErrUnknownKey: a value sealed under a key the key file no longer
	// holds.
	ErrUnknownKey = errors.New("secrets: sealed under a key the key file does not hold")
	// ErrBrokenSeal: a sealed value that does not open under its key, or
	// was sealed for another tenant or name.
	ErrBrokenSeal = errors.New("secrets: sealed value does not open (tampered, or moved from another secret)")
)

// Keyring is the keys of one read of the key file; immutable.
type Keyring struct {
	ids  []string // in file order: ids[0] seals
	keys map[string]*[keyBytes]byte
}

// ParseKeyring reads a key file's content. Its errors name the line and
// what is wrong, never a key's bytes.
func ParseKeyring(data []byte) (*Keyring, error) {
	if len(data) > MaxKeyFileBytes {
		return nil, fmt.Errorf("secrets: key file is %d bytes; at most %d", len(data), MaxKeyFileBytes)
	}
	k := &Keyring{keys: map[string]*[keyBytes]byte{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1024), MaxKeyFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("secrets: key file line %d: want `<key-id> <base64 of %d bytes>`, got %d fields", n, keyBytes, len(fields))
		}
		id := fields[0]
		if !schemas.ValidSecretKeyID(id) {
			return nil, fmt.Errorf("secrets: key file line %d: a key id is 1-64 characters of [A-Za-z0-9_.-], starting with a letter or digit", n)
		}
		if _, dup := k.keys[id]; dup {
			return nil, fmt.Errorf("secrets: key file line %d: key id %q appears twice", n, id)
		}
		raw, err := base64.StdEncoding.DecodeString(fields[1])
		if err != nil || len(raw) != keyBytes {
			return nil, fmt.Errorf("secrets: key file line %d (key %q): the key is not the standard base64 of %d bytes", n, id, keyBytes)
		}
		var key [keyBytes]byte
		copy(key[:], raw)
		clear(raw)
		k.ids = append(k.ids, id)
		k.keys[id] = &key
		if len(k.ids) > MaxKeys {
			return nil, fmt.Errorf("secrets: key file holds more than %d keys", MaxKeys)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("secrets: key file: %w", err)
	}
	if len(k.ids) == 0 {
		return nil, errors.New("secrets: key file holds no key (one line `<key-id> <base64 of 32 random bytes>`; `warmfleet secret new-key --key-file F` writes one)")
	}
	return k, nil
}

// SealingKeyID is the id of the key new values are sealed under: the
// file's first.
func (k *Keyring) SealingKeyID() string { return k.ids[0] }

// KeyIDs are the ids of every key, the sealing key first.
func (k *Keyring) KeyIDs() []string { return append([]string(nil), k.ids...) }

// Has reports whether the keyring holds the key id.
func (k *Keyring) Has(id string) bool { _, ok := k.keys[id]; return ok }

// boundTo is what a sealed value is bound to: a value moved to another
// secret's key (another tenant's included) does not open there.
func boundTo(tenant, name string) []byte {
	return []byte("warmfleet-secret\x00" + tenant + "\x00" + name)
}

// Seal seals value for tenant's secret name under the sealing key: a
// random nonce, then the secretbox of the binding (length-prefixed) and
// the value.
func (k *Keyring) Seal(tenant, name string, value []byte) (keyID string, sealed []byte, err error) {
	var nonce [nonceBytes]byte
	if _, err := io.ReadFull(rand.Reader, nonce[:]); err != nil {
		return "", nil, fmt.Errorf("secrets: nonce: %w", err)
	}
	bound := boundTo(tenant, name)
	msg := make([]byte, 0, 2+len(bound)+len(value))
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(bound)))
	msg = append(append(msg, bound...), value...)
	defer clear(msg)
	keyID = k.ids[0]
	return keyID, secretbox.Seal(nonce[:], msg, &nonce, k.keys[keyID]), nil
}

// Open opens a value sealed under keyID for tenant's secret name.
func (k *Keyring) Open(keyID, tenant, name string, sealed []byte) ([]byte, error) {
	key, ok := k.keys[keyID]
	if !ok {
		return nil, fmt.Errorf("%w (key %q)", ErrUnknownKey, keyID)
	}
	if len(sealed) < nonceBytes+secretbox.Overhead {
		return nil, ErrBrokenSeal
	}
	var nonce [nonceBytes]byte
	copy(nonce[:], sealed[:nonceBytes])
	msg, ok := secretbox.Open(nil, sealed[nonceBytes:], &nonce, key)
	if !ok || len(msg) < 2 {
		return nil, ErrBrokenSeal
	}
	bound := boundTo(tenant, name)
	n := int(binary.BigEndian.Uint16(msg))
	if n != len(bound) || len(msg) < 2+n || !bytes.Equal(msg[2:2+n], bound) {
		clear(msg)
		return nil, ErrBrokenSeal
	}
	return msg[2+n:], nil
}

// newKeyLine is a fresh key's line of the key file.
func newKeyLine(id string) (string, error) {
	var key [keyBytes]byte
	if _, err := io.ReadFull(rand.Reader, key[:]); err != nil {
		return "", fmt.Errorf("secrets: new key: %w", err)
	}
	defer clear(key[:])
	return id + " " + base64.StdEncoding.EncodeToString(key[:]) + "\n", nil
}
