package apicall

import (
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

const fuzzKey = "sk-fuzz-0123456789abcdef"

// FuzzStatusError: whatever a provider answers, the error never shows the
// key, is valid UTF-8 of bounded length, and carries a known code.
func FuzzStatusError(f *testing.F) {
	f.Add(429, "7", []byte(`{"error":"rate limited"}`))
	f.Add(409, "", []byte(`{"error":"out of stock; your key `+fuzzKey+` is fine"}`))
	f.Add(500, "Fri, 01 Mar 2030 12:00:30 GMT", []byte("<html>\x00\xff"+strings.ToUpper(fuzzKey)+"</html>"))
	f.Add(401, "-1", []byte(`{"error":{"code":"E","message":"`+fuzzKey[:10]+`"}}`))
	now := time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC)
	key := NewKey(fuzzKey)
	f.Fuzz(func(t *testing.T, status int, retry string, body []byte) {
		h := http.Header{}
		h.Set("Retry-After", retry)
		e := StatusError("p", key, nil, "provision", "r1", status, h, body, now)
		text := e.Error()
		if strings.Contains(strings.ToLower(text), strings.ToLower(fuzzKey)) {
			t.Fatalf("error shows the key: %q", text)
		}
		if !utf8.ValidString(e.Message) {
			t.Fatalf("message is not UTF-8: %q", e.Message)
		}
		if len(e.Message) > MaxMessageBytes+len("HTTP -9223372036854775808: ")+len("…") {
			t.Fatalf("message of %d bytes", len(e.Message))
		}
		if e.RetryAfter < 0 || e.RetryAfter > MaxRetryAfter || (e.RetryAfter > 0 && e.Code != capacity.CodeRateLimited) {
			t.Fatalf("retry after %v with code %q", e.RetryAfter, e.Code)
		}
		switch e.Code {
		case "", capacity.CodeUnauthorized, capacity.CodeNotFound, capacity.CodeRateLimited, capacity.CodeOutOfStock, capacity.CodeInvalid:
		default:
			t.Fatalf("unexpected code %q", e.Code)
		}
		if (status == 401 || status == 403) != (e.Code == capacity.CodeUnauthorized) {
			t.Fatalf("status %d mapped to %q", status, e.Code)
		}
	})
}
