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
		if err := checkMsgpackLengths(data); err != nil {
			return fmt.Errorf("%w: msgpack: %v", ErrMalformed, err)
		}
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

// checkMsgpackLengths walks the first msgpack value in data, without
// recursion or allocation, and fails where a string, binary, extension, array
// or map claims more bytes or elements than data holds. The msgpack decoder
// allocates a slice of structs for an array's claimed length before reading
// it, so without this check a few bytes can demand terabytes.
func checkMsgpackLengths(data []byte) error {
	p, pending := 0, 1 // next byte; values still to read
	length := func(size int) (int64, error) {
		if len(data)-p < size {
			return 0, io.ErrUnexpectedEOF
		}
		var n int64
		for _, b := range data[p : p+size] {
			n = n<<8 | int64(b)
		}
		p += size
		return n, nil
	}
	for ; pending > 0; pending-- {
		if p >= len(data) {
			return io.ErrUnexpectedEOF
		}
		c := data[p]
		p++
		var (
			skip, values int64
			err          error
		)
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
		case c <= 0x8f: // fixmap
			values = 2 * int64(c&0x0f)
		case c <= 0x9f: // fixarray
			values = int64(c & 0x0f)
		case c <= 0xbf: // fixstr
			skip = int64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = length(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, err = length(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, err = length(4)
		case c >= 0xc7 && c <= 0xc9: // ext8, ext16, ext32: length, type, data
			skip, err = length(1 << (c - 0xc7))
			skip++
		case c == 0xca, c == 0xcb: // float32, float64
			skip = 4 << (c - 0xca)
		case c >= 0xcc && c <= 0xcf: // uint8..uint64
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3: // int8..int64
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext1..fixext16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc || c == 0xdd: // array16, array32
			values, err = length(2 << (c - 0xdc))
		case c == 0xde || c == 0xdf: // map16, map32
			values, err = length(2 << (c - 0xde))
			values *= 2
		default:
			return fmt.Errorf("invalid code %#x", c)
		}
		if err != nil {
			return err
		}
		if left := int64(len(data) - p); skip > left || values > left {
			return fmt.Errorf("code %#x claims more than the %d bytes left", c, left)
		}
		p += int(skip)
		pending += int(values)
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
