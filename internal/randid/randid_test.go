package randid_test

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"sync"
	"testing"

	"github.com/warmfleet/warmfleet/internal/randid"
)

func TestHexShape(t *testing.T) {
	for _, n := range []int{0, 1, 3, 6, 8, 12} {
		id := randid.Hex("rt-", n)
		if !strings.HasPrefix(id, "rt-") {
			t.Fatalf("Hex(rt-, %d) = %q: prefix lost", n, id)
		}
		b, err := hex.DecodeString(strings.TrimPrefix(id, "rt-"))
		if err != nil || len(b) != n {
			t.Fatalf("Hex(rt-, %d) = %q: %d bytes, %v", n, id, len(b), err)
		}
	}
}

func TestTokenShape(t *testing.T) {
	for _, n := range []int{0, 1, 16, 32} {
		tok := randid.Token(n)
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) != n {
			t.Fatalf("Token(%d) = %q: %d bytes, %v", n, tok, len(b), err)
		}
	}
}

func TestBytesNegative(t *testing.T) {
	if b := randid.Bytes(-1); len(b) != 0 {
		t.Fatalf("Bytes(-1) = %d bytes", len(b))
	}
}

// TestUnique: ids minted at once, from many goroutines, never repeat.
func TestUnique(t *testing.T) {
	const goroutines, each = 8, 500
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		wg   sync.WaitGroup
	)
	for range goroutines {
		wg.Go(func() {
			for range each {
				id, tok := randid.Hex("x-", 8), randid.Token(16)
				mu.Lock()
				if seen[id] || seen[tok] {
					mu.Unlock()
					t.Errorf("repeated: %s %s", id, tok)
					return
				}
				seen[id], seen[tok] = true, true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}
