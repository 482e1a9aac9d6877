package secrets

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// keyFileHeader opens a key file EnsureKeyFile writes.
const keyFileHeader = `# warmfleet secrets key file: one key a line, "<key-id> <base64 of 32 random bytes>".
# The first key seals; every key opens. Rotate: warmfleet secret new-key --key-file THIS,
# then warmfleet secret rotate-key, then remove the old line (docs/security.md, Secrets).
`

// KeyFile is the key file the control plane seals and opens with, read
// again whenever it changes (another inode, size or mtime): a key is added
// or removed without a restart. A file that no longer parses keeps the
// keyring last read, and the reason is logged (never a key).
type KeyFile struct {
	path string
	log  *zap.Logger

	mu   sync.Mutex
	ring *Keyring
	seen os.FileInfo
}

// LoadKeyFile reads the key file at path. It refuses a file that does not
// parse, or that users other than its owner may read or write.
func LoadKeyFile(path string, log *zap.Logger) (*KeyFile, error) {
	f := &KeyFile{path: path, log: log}
	ring, st, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	f.ring, f.seen = ring, st
	return f, nil
}

// Keyring is the file's keys as last read, read again first when the file
// changed since.
func (f *KeyFile) Keyring() *Keyring {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.path)
	if err == nil && os.SameFile(st, f.seen) && st.Size() == f.seen.Size() && st.ModTime().Equal(f.seen.ModTime()) {
		return f.ring
	}
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) || f.seen != nil {
			f.log.Error("secrets key file unreadable; keeping the keys last read", zap.String("path", f.path), zap.Error(err))
		}
		f.seen = nil
		return f.ring
	}
	ring, st, err := readKeyFile(f.path)
	if err != nil {
		f.log.Error("secrets key file changed but does not load; keeping the keys last read", zap.String("path", f.path), zap.Error(err))
		// Not read again until it changes once more.
		f.seen = st
		return f.ring
	}
	f.ring, f.seen = ring, st
	f.log.Info("secrets key file read again", zap.String("path", f.path),
		zap.String("sealing_key", ring.SealingKeyID()), zap.Strings("keys", ring.KeyIDs()))
	return f.ring
}

// readKeyFile reads and parses path; st is what was read (non-nil when the
// file could be opened, even if it did not parse).
func readKeyFile(path string) (*Keyring, os.FileInfo, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("secrets: key file: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("secrets: key file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, st, fmt.Errorf("secrets: key file %s is not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, st, fmt.Errorf("secrets: key file %s has mode %v: others may read it; chmod 600 it", path, st.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(fh, MaxKeyFileBytes+1))
	if err != nil {
		return nil, st, fmt.Errorf("secrets: key file: %w", err)
	}
	defer clear(data)
	ring, err := ParseKeyring(data)
	if err != nil {
		return nil, st, fmt.Errorf("%s: %w", path, err)
	}
	return ring, st, nil
}

// NewKeyID is a fresh key id: when it was made, and random bits so two
// made in one second differ.
func NewKeyID(now time.Time) string {
	var b [4]byte
	_, _ = io.ReadFull(rand.Reader, b[:])
	return "k" + now.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// EnsureKeyFile creates path (mode 0600, its directory 0700) holding one
// fresh key when it does not exist; created says whether it did.
func EnsureKeyFile(path string) (created bool, err error) {
	if _, err := os.Stat(path); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("secrets: key file: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("secrets: key file: %w", err)
	}
	line, err := newKeyLine(NewKeyID(time.Now()))
	if err != nil {
		return false, err
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil // made by someone else meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("secrets: key file: %w", err)
	}
	_, err = fh.WriteString(keyFileHeader + line)
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return false, fmt.Errorf("secrets: write key file: %w", err)
	}
	return true, nil
}

// NewKey puts a fresh key first in the key file at path, which must load:
// from then on the control plane seals with it and still opens with the
// others. The file is replaced atomically (a 0600 file beside it, renamed
// over it). It returns the new key's id.
func NewKey(path string) (string, error) {
	if _, _, err := readKeyFile(path); err != nil {
		return "", err
	}
	old, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("secrets: key file: %w", err)
	}
	defer clear(old)
	id := NewKeyID(time.Now())
	line, err := newKeyLine(id)
	if err != nil {
		return "", err
	}
	// The new line goes before the first key, after the leading comments.
	lines := strings.SplitAfter(string(old), "\n")
	at := 0
	for at < len(lines) {
		t := strings.TrimSpace(lines[at])
		if t != "" && !strings.HasPrefix(t, "#") {
			break
		}
		at++
	}
	if at == len(lines) && len(lines) > 0 && !strings.HasSuffix(lines[at-1], "\n") {
		lines[at-1] += "\n"
	}
	content := strings.Join(lines[:at], "") + line + strings.Join(lines[at:], "")
	if err := replaceFile(path, []byte(content)); err != nil {
		return "", err
	}
	return id, nil
}

// replaceFile writes data to a 0600 file beside path and renames it over
// path, so a reader sees the old file or the new one, never half of one.
func replaceFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
	if err != nil {
		return fmt.Errorf("secrets: key file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, nothing is there
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("secrets: replace key file: %w", err)
	}
	return nil
}
