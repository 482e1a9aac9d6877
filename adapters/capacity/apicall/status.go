package apicall

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

// MaxMessageBytes bounds how much of a provider's error text reaches our
// errors (and so logs and events).
const MaxMessageBytes = 300

// sanitizeWindow is how much of an error body is looked at.
const sanitizeWindow = 64 << 10

// MaxRetryAfter caps a provider's Retry-After so a garbled header cannot
// park a caller for days.
const MaxRetryAfter = time.Hour

// StockPhrases are what providers and the clouds behind them say when
// there is nothing to rent, matched case-insensitively in an error's
// message; an adapter may add its provider's own.
var StockPhrases = []string{
	"out of stock", "out-of-stock", "out_of_stock", "out of capacity", "insufficient capacity",
	"insufficientcapacity", "insufficient_capacity",
	"no capacity", "capacity not available", "not enough capacity", "sold out", "no availability",
	"not available in", "unavailable in", "insufficient resources",
}

// StatusError maps a non-2xx answer to a coded error, or to an uncoded one
// when the outcome is unknown (5xx, conflicts that are not about stock).
// The message is sanitized: the API key is removed wherever it appears,
// control characters dropped, length bounded. stock are the phrases that
// mean out of stock (StockPhrases when nil).
func StatusError(provider string, key Key, stock []string, op, ref string, status int, header http.Header, body []byte, now time.Time) *capacity.Error {
	msg := Sanitize(key, errorMessage(body))
	e := &capacity.Error{Provider: provider, Op: op, Ref: ref, Message: "HTTP " + strconv.Itoa(status)}
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
	case outOfStock(msg, stock):
		e.Code = capacity.CodeOutOfStock
	case status == http.StatusBadRequest || status == http.StatusUnprocessableEntity:
		e.Code = capacity.CodeInvalid
	default:
		// 409 not about stock, 5xx, anything else: we cannot tell whether
		// the provider acted, so the error stays uncoded (ambiguous).
	}
	return e
}

func outOfStock(msg string, phrases []string) bool {
	if phrases == nil {
		phrases = StockPhrases
	}
	m := strings.ToLower(msg)
	for _, p := range phrases {
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

// Sanitize removes the key, folds whitespace and control characters to
// single spaces, and truncates on a rune boundary: what of a provider's
// text may reach an error.
func Sanitize(key Key, s string) string {
	// Only the start of a long body can reach the message. Cut it before
	// redacting (which is quadratic-ish), dropping a key's length more so a
	// key split by the cut cannot survive as a fragment.
	if len(s) > sanitizeWindow {
		s = s[:sanitizeWindow-len(key.Reveal())]
	}
	s = key.Redact(s)
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
		if b.Len()+utf8.RuneLen(r) > MaxMessageBytes {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
	}
	// Redact again: folding could have joined a key split by whitespace.
	return key.Redact(b.String())
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
		if secs > int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), MaxRetryAfter)
}
