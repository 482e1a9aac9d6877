// Package codec owns how warmfleet messages are encoded on NATS: msgpack by
// default, JSON for operators. Decoding is strict: unknown fields are refused.
package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is a wire encoding.
type Encoding int

const (
	MsgPack Encoding = iota
	JSON
)

// ContentTypeHeader is the header operators set to ask for JSON.
const ContentTypeHeader = "Content-Type"

// Content types carried in ContentTypeHeader.
const (
	ContentTypeJSON    = "application/json"
	ContentTypeMsgPack = "application/msgpack"
)

func (e Encoding) String() string {
	if e == JSON {
		return "json"
	}
	return "msgpack"
}

// ContentType is the header value naming e.
func (e Encoding) ContentType() string {
	if e == JSON {
		return ContentTypeJSON
	}
	return ContentTypeMsgPack
}

// Detect picks the encoding of a message: the Content-Type header when set,
// else JSON for a body whose first non-space byte is '{', else msgpack.
func Detect(h nats.Header, data []byte) Encoding {
	if h != nil {
		switch h.Get(ContentTypeHeader) {
		case ContentTypeJSON, "json", "text/json":
			return JSON
		case ContentTypeMsgPack, "msgpack":
			return MsgPack
		}
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		return JSON
	}
	return MsgPack
}

// Decode errors, matched with errors.Is. ErrUnknownField also matches
// ErrMalformed.
var (
	ErrMalformed    = errors.New("malformed message")
	ErrUnknownField = fmt.Errorf("%w: unknown field", ErrMalformed)
)

// classify wraps a decoder's error so callers can tell an unknown field
// (a client built against another schema) from garbage.
func classify(enc string, err error) error {
	if strings.Contains(err.Error(), "unknown field") {
		return fmt.Errorf("%w: %s: %v", ErrUnknownField, enc, err)
	}
	return fmt.Errorf("%w: %s: %v", ErrMalformed, enc, err)
}

// Decode strictly decodes data in encoding e into v: unknown fields and
// trailing data are errors wrapping ErrMalformed.
func Decode(e Encoding, data []byte, v any) (err error) {
	// The msgpack decoder panics on some malformed input (nil where a
	// time.Time belongs); that input is malformed, not a reason to crash.
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s: decoder panic: %v", ErrMalformed, e, p)
		}
	}()
	if len(data) == 0 {
		return fmt.Errorf("%w: empty body", ErrMalformed)
	}
	switch e {
	case JSON:
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return classify("json", err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return fmt.Errorf("%w: json: trailing data after the object", ErrMalformed)
		}
	default:
		r := bytes.NewReader(data)
		dec := msgpack.NewDecoder(r)
		dec.DisallowUnknownFields(true)
		dec.SetCustomStructTag("json")
		if err := dec.Decode(v); err != nil {
			return classify("msgpack", err)
		}
		if r.Len() != 0 {
			return fmt.Errorf("%w: msgpack: %d trailing bytes", ErrMalformed, r.Len())
		}
	}
	return nil
}

// Encode encodes v in encoding e. msgpack uses the json struct tags so both
// encodings name fields identically.
func Encode(e Encoding, v any) ([]byte, error) {
	if e == JSON {
		return json.Marshal(v)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetCustomStructTag("json")
	enc.SetOmitEmpty(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// DecodeMsg detects the encoding of m and decodes it into v.
func DecodeMsg(m *nats.Msg, v any) (Encoding, error) {
	e := Detect(m.Header, m.Data)
	return e, Decode(e, m.Data, v)
}
