package shadeform

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// maxMessageBytes bounds how much of a provider's error text reaches our
// errors (and so logs and events).
const maxMessageBytes = 300

// sanitizeWindow is how much of an error body is looked at.
const sanitizeWindow = 64 << 10

// maxRetryAfter caps a provider's Retry-After so a garbled header cannot
// park a caller for days.
const maxRetryAfter = time.Hour

// stockPhrases are what Shadeform and the clouds behind it say when there is
// nothing to rent. Matched case-insensitively in the error message.
var stockPhrases = []string{
	"out of stock", "out-of-stock", "out_of_stock", "out of capacity", "insufficient capacity",
	"insufficientcapacity", "insufficient_capacity",
	"no capacity", "capacity not available", "not enough capacity", "sold out", "no availability",
	"not available in", "unavailable in", "insufficient resources",
}

// apiError maps a non-2xx answer to a coded error, or to an uncoded one
// when the outcome is unknown (5xx, conflicts that are not about stock).
// The message is sanitized: the API key is removed wherever it appears,
// control characters dropped, length bounded.
func apiError(key APIKey, op, ref string, status int, header http.Header, body []byte, now time.Time) *capacity.Error {
	msg := sanitize(key, errorMessage(body))
	e := &capacity.Error{Provider: Type, Op: op, Ref: ref, Message: "HTTP " + strconv.Itoa(status)}
	if msg != "" {
		e.Message += ": " + msg
	}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.Code = capacity.CodeUnauthorized
	case status == http.StatusNotFound:
		e.Code = capacity.CodeNotFound
	case status == http.StatusTooManyRequests:
		e.Code = capacity.CodeRateLimited
		e.RetryAfter = retryAfter(header.Get("Retry-After"), now)
	case outOfStock(msg):
		e.Code = capacity.CodeOutOfStock
	case status == http.StatusBadRequest || status == http.StatusUnprocessableEntity:
		e.Code = capacity.CodeInvalid
	default:
		// 409 not about stock, 5xx, anything else: we cannot tell whether
		// Shadeform acted, so the error stays uncoded (ambiguous).
	}
	return e
}

func outOfStock(msg string) bool {
	m := strings.ToLower(msg)
	for _, p := range stockPhrases {
		if strings.Contains(m, p) {
			return true
		}
	}
	return false
}

// errorMessage pulls the human message out of an error body: a JSON object
// with error/message/detail (a string, or an object with a message), or
// the body itself when it is not JSON.
func errorMessage(body []byte) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return string(body)
	}
	var parts []string
	for _, k := range []string{"error", "message", "detail", "error_message", "msg", "error_code", "code"} {
		raw, ok := obj[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if s != "" {
				parts = append(parts, s)
			}
			continue
		}
		var nested struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		}
		if json.Unmarshal(raw, &nested) == nil {
			for _, s := range []string{nested.Code, nested.Message} {
				if s != "" {
					parts = append(parts, s)
				}
			}
		}
	}
	return strings.Join(parts, ": ")
}

// sanitize removes the key, folds whitespace and control characters to
// single spaces, and truncates on a rune boundary.
func sanitize(key APIKey, s string) string {
	// Only the start of a long body can reach the message. Cut it before
	// redacting (which is quadratic-ish), dropping a key's length more so a
	// key split by the cut cannot survive as a fragment.
	if len(s) > sanitizeWindow {
		s = s[:sanitizeWindow-len(key.reveal())]
	}
	s = key.redact(s)
	var b strings.Builder
	space := false
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsSpace(r) || unicode.IsControl(r) {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		if b.Len()+utf8.RuneLen(r) > maxMessageBytes {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
	}
	// Redact again: folding could have joined a key split by whitespace.
	return key.redact(b.String())
}

// retryAfter parses Retry-After as seconds or an HTTP date; zero when
// absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}
