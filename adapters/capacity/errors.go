package capacity

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Code classifies a failure whose outcome is known. An error without a code
// means the outcome is unknown (the provider may or may not have acted).
type Code string

// Codes, each with a sentinel below for errors.Is.
const (
	CodeUnsupported     Code = "unsupported"
	CodeOutOfStock      Code = "out_of_stock"
	CodeUnauthorized    Code = "unauthorized"
	CodeRateLimited     Code = "rate_limited"
	CodeNotFound        Code = "not_found"
	CodeStaleGeneration Code = "stale_generation"
	CodeInvalid         Code = "invalid"
)

// Sentinels. Match with errors.Is(err, capacity.ErrOutOfStock); read detail
// (RetryAfter, Op, Ref) with errors.As into *Error.
var (
	// ErrUnsupported: the provider does not have this capability (see
	// Support). Nothing happened.
	ErrUnsupported error = &Error{Code: CodeUnsupported}
	// ErrOutOfStock: the provider has no capacity for this offer now.
	// Nothing was allocated.
	ErrOutOfStock error = &Error{Code: CodeOutOfStock}
	// ErrUnauthorized: the credentials were refused. Nothing happened.
	ErrUnauthorized error = &Error{Code: CodeUnauthorized}
	// ErrRateLimited: the provider asked us to slow down; RetryAfter says
	// for how long when it said. Nothing happened.
	ErrRateLimited error = &Error{Code: CodeRateLimited}
	// ErrNotFound: no machine of ours answers to that reference.
	ErrNotFound error = &Error{Code: CodeNotFound}
	// ErrStaleGeneration: the command carries an older generation than the
	// machine's; a newer controller owns it. Nothing happened.
	ErrStaleGeneration error = &Error{Code: CodeStaleGeneration}
	// ErrInvalid: the request is malformed or impossible in the machine's
	// state. Nothing happened.
	ErrInvalid error = &Error{Code: CodeInvalid}
)

var codeText = map[Code]string{
	CodeUnsupported:     "capability not supported",
	CodeOutOfStock:      "out of stock",
	CodeUnauthorized:    "unauthorized",
	CodeRateLimited:     "rate limited",
	CodeNotFound:        "not found",
	CodeStaleGeneration: "stale generation",
	CodeInvalid:         "invalid request",
}

// Error is a capacity failure with its context. Code is empty when the
// outcome is unknown (the provider may have acted): such an error is
// Ambiguous. Adapters fill Message from what the provider said after
// removing anything secret: an Error is logged and published, so it never
// carries a credential.
type Error struct {
	Code Code
	// Provider is the adapter type ("shadeform").
	Provider string
	// Op is the contract method ("provision", "observe", …).
	Op string
	// Ref names the machine or rental the operation was about.
	Ref string
	// Message is the provider's own explanation, sanitized.
	Message string
	// RetryAfter is how long the provider asked us to wait (rate limits);
	// zero when it did not say.
	RetryAfter time.Duration
	// Err is the underlying cause, if any.
	Err error
}

// Error renders "<provider> <op> <ref>: <code text>: <message>".
func (e *Error) Error() string {
	var b strings.Builder
	for _, s := range []string{e.Provider, e.Op, e.Ref} {
		if s == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s)
	}
	if b.Len() == 0 {
		b.WriteString("capacity")
	}
	sep := ": "
	if e.Code != "" {
		b.WriteString(sep)
		if t, ok := codeText[e.Code]; ok {
			b.WriteString(t)
		} else {
			b.WriteString(string(e.Code))
		}
	} else {
		// Uncoded: the outcome is unknown, and the text says so.
		b.WriteString(": outcome unknown")
	}
	if e.Message != "" {
		b.WriteString(sep)
		b.WriteString(e.Message)
	}
	if e.RetryAfter > 0 {
		b.WriteString(" (retry after ")
		b.WriteString(e.RetryAfter.String())
		b.WriteByte(')')
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Is matches any *Error with the same code, so errors.Is(err, ErrNotFound)
// holds for every not-found error whatever its context.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with code and a message; callers set Provider,
// Op and Ref as they know them.
func Errorf(code Code, format string, args ...any) *Error {
	e := &Error{Code: code}
	if len(args) == 0 {
		e.Message = format
	} else {
		e.Message = fmt.Sprintf(format, args...)
	}
	return e
}

// CodeOf returns err's code, or "" when err is nil or its outcome is
// unknown.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// RetryAfter returns how long a rate-limited provider asked us to wait.
func RetryAfter(err error) (time.Duration, bool) {
	var e *Error
	if errors.As(err, &e) && e.Code == CodeRateLimited && e.RetryAfter > 0 {
		return e.RetryAfter, true
	}
	return 0, false
}

// Ambiguous reports whether err leaves the outcome unknown: the provider may
// have acted. The caller must reconcile (retry with the same OperationKey,
// or list owned capacity) before assuming nothing happened.
func Ambiguous(err error) bool {
	return err != nil && CodeOf(err) == ""
}
