package codec_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/warmfleet/warmfleet/bus/codec"
)

// inner and sample have Go field names that differ from their json tags, so
// a test can tell which names an encoding used.
type inner struct {
	Level  int    `json:"level"`
	Detail string `json:"detail,omitempty"`
}

type sample struct {
	Name     string            `json:"name"`
	Count    int64             `json:"count,omitempty"`
	Ratio    float64           `json:"ratio,omitempty"`
	Enabled  bool              `json:"enabled,omitempty"`
	Tags     []string          `json:"tags,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	Nested   inner             `json:"nested"`
	Items    []inner           `json:"items,omitempty"`
	Optional *int              `json:"optional,omitempty"`
	Token    uint64            `json:"token,omitempty"`
}

func fullSample() sample {
	seven := 7
	return sample{
		Name:     "node-1",
		Count:    -42,
		Ratio:    0.25,
		Enabled:  true,
		Tags:     []string{"a", "", "ü"},
		Labels:   map[string]string{"zone": "eu-1", "empty": ""},
		Nested:   inner{Level: 3, Detail: "deep"},
		Items:    []inner{{Level: 1}, {Level: 2, Detail: "two"}},
		Optional: &seven,
		Token:    1<<63 + 5,
	}
}

func hdr(kv ...string) nats.Header {
	h := nats.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func mustMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatalf("msgpack.Marshal: %v", err)
	}
	return b
}

func TestEncodingNames(t *testing.T) {
	if got := codec.JSON.String(); got != "json" {
		t.Errorf("JSON.String() = %q", got)
	}
	if got := codec.MsgPack.String(); got != "msgpack" {
		t.Errorf("MsgPack.String() = %q", got)
	}
	if got := codec.JSON.ContentType(); got != codec.ContentTypeJSON {
		t.Errorf("JSON.ContentType() = %q", got)
	}
	if got := codec.MsgPack.ContentType(); got != codec.ContentTypeMsgPack {
		t.Errorf("MsgPack.ContentType() = %q", got)
	}
	// The zero Encoding is msgpack, the default on the bus.
	var zero codec.Encoding
	if zero != codec.MsgPack {
		t.Errorf("zero Encoding = %v, want msgpack", zero)
	}
}

func TestDetect(t *testing.T) {
	mp := mustMsgpack(t, map[string]any{"name": "x"})
	tests := []struct {
		name string
		h    nats.Header
		data []byte
		want codec.Encoding
	}{
		{"nil header, json object", nil, []byte(`{"name":"x"}`), codec.JSON},
		{"nil header, leading spaces", nil, []byte(`   {"name":"x"}`), codec.JSON},
		{"nil header, leading tab cr lf", nil, []byte("\t\r\n {}"), codec.JSON},
		{"nil header, msgpack map", nil, mp, codec.MsgPack},
		{"nil header, empty body", nil, nil, codec.MsgPack},
		{"nil header, whitespace only", nil, []byte(" \n\t"), codec.MsgPack},
		{"nil header, json array is not sniffed", nil, []byte(`[{"name":"x"}]`), codec.MsgPack},
		{"nil header, json null", nil, []byte(`null`), codec.MsgPack},
		{"nil header, other whitespace not trimmed", nil, []byte("\v{}"), codec.MsgPack},
		{"nil header, BOM not trimmed", nil, []byte("\xef\xbb\xbf{}"), codec.MsgPack},
		{"empty header map sniffs", nats.Header{}, []byte(`{}`), codec.JSON},
		{"header application/json beats msgpack body", hdr(codec.ContentTypeHeader, codec.ContentTypeJSON), mp, codec.JSON},
		{"header json", hdr(codec.ContentTypeHeader, "json"), mp, codec.JSON},
		{"header text/json", hdr(codec.ContentTypeHeader, "text/json"), nil, codec.JSON},
		{"header application/msgpack beats json body", hdr(codec.ContentTypeHeader, codec.ContentTypeMsgPack), []byte(`{"name":"x"}`), codec.MsgPack},
		{"header msgpack", hdr(codec.ContentTypeHeader, "msgpack"), []byte(`{}`), codec.MsgPack},
		{"unknown header value falls back to sniffing json", hdr(codec.ContentTypeHeader, "text/plain"), []byte(` {}`), codec.JSON},
		{"unknown header value falls back to sniffing msgpack", hdr(codec.ContentTypeHeader, "text/plain"), mp, codec.MsgPack},
		{"json with parameters is not an exact match", hdr(codec.ContentTypeHeader, "application/json; charset=utf-8"), mp, codec.MsgPack},
		{"other headers ignored", hdr("Nats-Msg-Id", "abc"), []byte(`{}`), codec.JSON},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := codec.Detect(tc.h, tc.data); got != tc.want {
				t.Errorf("Detect = %v, want %v", got, tc.want)
			}
		})
	}
}

// Whatever Encode produces, Detect recognises without a header.
func TestDetectRecognisesEncodeOutput(t *testing.T) {
	for _, e := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		for _, v := range []any{fullSample(), sample{}, &sample{Name: "{"}} {
			b, err := codec.Encode(e, v)
			if err != nil {
				t.Fatalf("Encode(%v): %v", e, err)
			}
			if got := codec.Detect(nil, b); got != e {
				t.Errorf("Detect(Encode(%v, %+v)) = %v", e, v, got)
			}
		}
	}
}

func TestDecodeStrictness(t *testing.T) {
	type tcase struct {
		name        string
		enc         codec.Encoding
		data        []byte
		unknown     bool // want ErrUnknownField (which is also ErrMalformed)
		errContains string
	}
	tests := []tcase{
		{name: "json unknown top-level field", enc: codec.JSON, data: []byte(`{"name":"x","bogus":1}`), unknown: true, errContains: `"bogus"`},
		{name: "json unknown nested field", enc: codec.JSON, data: []byte(`{"nested":{"level":1,"colour":"red"}}`), unknown: true, errContains: `"colour"`},
		{name: "json go field name is not a wire name", enc: codec.JSON, data: []byte(`{"Optional_":1}`), unknown: true},
		{name: "msgpack unknown top-level field", enc: codec.MsgPack, data: mustMsgpack(t, map[string]any{"name": "x", "bogus": 1}), unknown: true, errContains: `"bogus"`},
		{name: "msgpack unknown nested field", enc: codec.MsgPack, data: mustMsgpack(t, map[string]any{"nested": map[string]any{"colour": "red"}}), unknown: true, errContains: `"colour"`},
		{name: "msgpack go field name is not a wire name", enc: codec.MsgPack, data: mustMsgpack(t, map[string]any{"Name": "x"}), unknown: true, errContains: `"Name"`},
		{name: "json empty body", enc: codec.JSON, data: []byte{}, errContains: "empty body"},
		{name: "json nil body", enc: codec.JSON, data: nil, errContains: "empty body"},
		{name: "msgpack empty body", enc: codec.MsgPack, data: []byte{}, errContains: "empty body"},
		{name: "json trailing object", enc: codec.JSON, data: []byte(`{"name":"a"}{"name":"b"}`), errContains: "trailing"},
		{name: "json trailing garbage", enc: codec.JSON, data: []byte(`{"name":"a"} x`), errContains: "trailing"},
		{name: "json trailing close brace", enc: codec.JSON, data: []byte(`{"name":"a"}}`), errContains: "trailing"},
		{name: "msgpack trailing bytes", enc: codec.MsgPack, data: append(mustMsgpack(t, map[string]any{"name": "a"}), 0xc0, 0xc0), errContains: "2 trailing bytes"},
		{name: "json truncated", enc: codec.JSON, data: []byte(`{"name":`)},
		{name: "json open brace only", enc: codec.JSON, data: []byte(`{`)},
		{name: "json wrong type", enc: codec.JSON, data: []byte(`{"count":"seven"}`)},
		{name: "json not an object", enc: codec.JSON, data: []byte(`"name"`)},
		{name: "msgpack truncated", enc: codec.MsgPack, data: mustMsgpack(t, map[string]any{"name": "abcdef"})[:5]},
		{name: "msgpack wrong type", enc: codec.MsgPack, data: mustMsgpack(t, map[string]any{"count": "seven"})},
		{name: "msgpack never-used code", enc: codec.MsgPack, data: []byte{0xc1}},
		{name: "msgpack json text", enc: codec.MsgPack, data: []byte(`{"name":"x"}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v sample
			err := codec.Decode(tc.enc, tc.data, &v)
			if err == nil {
				t.Fatalf("Decode succeeded: %+v", v)
			}
			if !errors.Is(err, codec.ErrMalformed) {
				t.Errorf("error %q does not match ErrMalformed", err)
			}
			if got := errors.Is(err, codec.ErrUnknownField); got != tc.unknown {
				t.Errorf("errors.Is(%q, ErrUnknownField) = %v, want %v", err, got, tc.unknown)
			}
			if tc.errContains != "" && !strings.Contains(err.Error(), tc.errContains) {
				t.Errorf("error %q does not contain %q", err, tc.errContains)
			}
			if !strings.Contains(err.Error(), tc.enc.String()) && !strings.Contains(err.Error(), "empty body") {
				t.Errorf("error %q does not name the encoding %v", err, tc.enc)
			}
		})
	}
}

func TestErrUnknownFieldWrapsErrMalformed(t *testing.T) {
	if !errors.Is(codec.ErrUnknownField, codec.ErrMalformed) {
		t.Fatal("ErrUnknownField does not match ErrMalformed")
	}
	if errors.Is(codec.ErrMalformed, codec.ErrUnknownField) {
		t.Fatal("ErrMalformed matches ErrUnknownField")
	}
}

func TestDecodeAcceptsTrailingWhitespaceJSON(t *testing.T) {
	var v sample
	if err := codec.Decode(codec.JSON, []byte("\n {\"name\":\"a\"} \r\n\t "), &v); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if v.Name != "a" {
		t.Fatalf("Name = %q", v.Name)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, e := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		for _, in := range []sample{fullSample(), {}, {Name: "only"}} {
			b, err := codec.Encode(e, in)
			if err != nil {
				t.Fatalf("Encode(%v): %v", e, err)
			}
			var out sample
			if err := codec.Decode(e, b, &out); err != nil {
				t.Fatalf("Decode(%v, %q): %v", e, b, err)
			}
			if !reflect.DeepEqual(in, out) {
				t.Errorf("%v round trip:\n in  %+v\n out %+v", e, in, out)
			}
		}
	}
}

// msgpack must name fields by their json tags, so an operator's JSON and a
// program's msgpack describe the same message.
func TestMsgpackUsesJSONTagNames(t *testing.T) {
	b, err := codec.Encode(codec.MsgPack, fullSample())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	want := []string{"count", "enabled", "items", "labels", "name", "nested", "optional", "ratio", "tags", "token"}
	if got := sortedKeys(m); !reflect.DeepEqual(got, want) {
		t.Errorf("msgpack keys = %v, want %v", got, want)
	}
	nested, ok := m["nested"].(map[string]any)
	if !ok {
		t.Fatalf("nested = %T, want a map", m["nested"])
	}
	if got := sortedKeys(nested); !reflect.DeepEqual(got, []string{"detail", "level"}) {
		t.Errorf("nested keys = %v", got)
	}

	// Both encodings name the same keys.
	jb, err := codec.Encode(codec.JSON, fullSample())
	if err != nil {
		t.Fatal(err)
	}
	var jm map[string]any
	if err := json.Unmarshal(jb, &jm); err != nil {
		t.Fatal(err)
	}
	if got := sortedKeys(jm); !reflect.DeepEqual(got, want) {
		t.Errorf("json keys = %v, want %v", got, want)
	}

	// A msgpack map keyed by json names, written by another client, decodes.
	other := mustMsgpack(t, map[string]any{
		"name":   "from-elsewhere",
		"count":  int8(5),
		"nested": map[string]any{"level": 9},
		"tags":   []string{"x"},
	})
	var out sample
	if err := codec.Decode(codec.MsgPack, other, &out); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want2 := sample{Name: "from-elsewhere", Count: 5, Nested: inner{Level: 9}, Tags: []string{"x"}}
	if !reflect.DeepEqual(out, want2) {
		t.Errorf("decoded %+v, want %+v", out, want2)
	}
}

// Encode omits empty fields in msgpack, as omitempty does in JSON.
func TestMsgpackOmitsEmpty(t *testing.T) {
	b, err := codec.Encode(codec.MsgPack, sample{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"count", "ratio", "enabled", "tags", "labels", "items", "optional", "token"} {
		if _, ok := m[k]; ok {
			t.Errorf("empty field %q was encoded", k)
		}
	}
	if m["name"] != "x" {
		t.Errorf("name = %v", m["name"])
	}
}

type stamped struct {
	At     time.Time  `json:"at"`
	Maybe  *time.Time `json:"maybe,omitempty"`
	Zero   time.Time  `json:"zero"`
	Others []time.Time
}

func TestTimeRoundTrip(t *testing.T) {
	loc := time.FixedZone("X", 5*3600+30*60)
	at := time.Date(2025, 3, 14, 15, 9, 26, 535897932, loc)
	maybe := time.Date(1969, 12, 31, 23, 59, 59, 1, time.UTC) // before the epoch
	in := stamped{
		At:     at,
		Maybe:  &maybe,
		Others: []time.Time{time.Unix(0, 0).UTC(), time.Date(2262, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(1<<33, 999).UTC()},
	}
	for _, e := range []codec.Encoding{codec.MsgPack, codec.JSON} {
		b, err := codec.Encode(e, in)
		if err != nil {
			t.Fatalf("Encode(%v): %v", e, err)
		}
		var out stamped
		if err := codec.Decode(e, b, &out); err != nil {
			t.Fatalf("Decode(%v): %v", e, err)
		}
		if !out.At.Equal(at) {
			t.Errorf("%v: At = %v, want %v", e, out.At, at)
		}
		if out.At.UnixNano() != at.UnixNano() {
			t.Errorf("%v: At lost nanoseconds: %d vs %d", e, out.At.UnixNano(), at.UnixNano())
		}
		if out.Maybe == nil || !out.Maybe.Equal(maybe) {
			t.Errorf("%v: Maybe = %v, want %v", e, out.Maybe, maybe)
		}
		if !out.Zero.IsZero() {
			t.Errorf("%v: Zero = %v, want the zero time", e, out.Zero)
		}
		if len(out.Others) != len(in.Others) {
			t.Fatalf("%v: Others = %v", e, out.Others)
		}
		for i := range in.Others {
			if !out.Others[i].Equal(in.Others[i]) {
				t.Errorf("%v: Others[%d] = %v, want %v", e, i, out.Others[i], in.Others[i])
			}
		}
	}
}

func TestDecodeMsg(t *testing.T) {
	jb, _ := codec.Encode(codec.JSON, fullSample())
	mb, _ := codec.Encode(codec.MsgPack, fullSample())
	tests := []struct {
		name string
		msg  *nats.Msg
		want codec.Encoding
		ok   bool
	}{
		{"json sniffed", &nats.Msg{Data: jb}, codec.JSON, true},
		{"msgpack default", &nats.Msg{Data: mb}, codec.MsgPack, true},
		{"json by header", &nats.Msg{Data: jb, Header: hdr(codec.ContentTypeHeader, codec.ContentTypeJSON)}, codec.JSON, true},
		{"header says msgpack, body is json", &nats.Msg{Data: jb, Header: hdr(codec.ContentTypeHeader, codec.ContentTypeMsgPack)}, codec.MsgPack, false},
		{"empty", &nats.Msg{}, codec.MsgPack, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v sample
			enc, err := codec.DecodeMsg(tc.msg, &v)
			if enc != tc.want {
				t.Errorf("encoding = %v, want %v", enc, tc.want)
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, codec.ErrMalformed) {
				t.Errorf("err %v does not match ErrMalformed", err)
			}
			if tc.ok && !reflect.DeepEqual(v, fullSample()) {
				t.Errorf("decoded %+v", v)
			}
		})
	}
}

// A msgpack array or map header may claim far more elements than the message
// holds. Decoding must fail on the missing bytes, not allocate for the claim:
// a few bytes from any publisher must not exhaust the decoder's memory.
func TestMsgpackHugeLengthClaims(t *testing.T) {
	key := func(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }
	claims := map[string][]byte{
		"array32":     {0xdd, 0x7f, 0xff, 0xff, 0xff},
		"array32 max": {0xdd, 0xff, 0xff, 0xff, 0xff},
		"array16":     {0xdc, 0xff, 0xff},
		"map32":       {0xdf, 0x7f, 0xff, 0xff, 0xff},
		"str32":       {0xdb, 0x7f, 0xff, 0xff, 0xff},
		"bin32":       {0xc6, 0x7f, 0xff, 0xff, 0xff},
	}
	names := make([]string, 0, len(claims))
	for n := range claims {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, field := range []string{"items", "tags", "labels", "name"} {
		for _, n := range names {
			t.Run(field+"/"+n, func(t *testing.T) {
				var b bytes.Buffer
				b.WriteByte(0x81)
				b.Write(key(field))
				b.Write(claims[n])
				b.WriteByte(0xc0) // one element, then the message ends
				var v sample
				err := codec.Decode(codec.MsgPack, b.Bytes(), &v)
				if !errors.Is(err, codec.ErrMalformed) {
					t.Fatalf("Decode = %v, want ErrMalformed", err)
				}
			})
		}
	}
}

// msgpack nil where a time.Time belongs made the msgpack decoder panic
// (reflect: IsNil on a struct value). It is malformed input, not a crash.
func TestMsgpackNilTimeIsMalformed(t *testing.T) {
	for name, data := range map[string][]byte{
		"field":         mustMsgpack(t, map[string]any{"at": nil}),
		"slice element": mustMsgpack(t, map[string]any{"Others": []any{nil}}),
	} {
		t.Run(name, func(t *testing.T) {
			var v stamped
			err := codec.Decode(codec.MsgPack, data, &v)
			if !errors.Is(err, codec.ErrMalformed) || errors.Is(err, codec.ErrUnknownField) {
				t.Fatalf("Decode = %v, want ErrMalformed", err)
			}
		})
	}
	// nil for a pointer to a time is an absent time.
	v := stamped{Maybe: &time.Time{}}
	if err := codec.Decode(codec.MsgPack, mustMsgpack(t, map[string]any{"maybe": nil}), &v); err != nil || v.Maybe != nil {
		t.Fatalf("Decode = %v, Maybe = %v; want nil, nil", err, v.Maybe)
	}
}

// Every msgpack format, at each width, passes the length check in Decode.
type wide struct {
	I8, I16, I32, I64 int64
	U64               uint64
	F32               float32
	F64               float64
	Bin               []byte
	Strs              []string
	Ints              []int
	Map               map[string]int
	At, Mid, Far      time.Time
}

func TestMsgpackAllFormatsDecode(t *testing.T) {
	big := make(map[string]int, 70000)
	for i := range 70000 {
		big[strconv.Itoa(i)] = i
	}
	in := wide{
		I8: -100, I16: -30000, I32: -2_000_000_000, I64: -1 << 62, U64: 1<<64 - 1,
		F32: 1.5, F64: -2.25,
		Bin:  bytes.Repeat([]byte{0xc1}, 70000),
		Strs: []string{"", strings.Repeat("a", 31), strings.Repeat("b", 32), strings.Repeat("c", 256), strings.Repeat("d", 70000)},
		Ints: make([]int, 70000),
		Map:  big,
		At:   time.Unix(1_700_000_000, 0).UTC(), // timestamp 32
		Far:  time.Unix(1<<40, 123).UTC(),       // timestamp 96
	}
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		b, err := codec.Encode(codec.MsgPack, make([]string, n))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		if err := codec.Decode(codec.MsgPack, b, &out); err != nil || len(out) != n {
			t.Fatalf("array of %d: len %d, %v", n, len(out), err)
		}
	}
	b, err := codec.Encode(codec.MsgPack, in)
	if err != nil {
		t.Fatal(err)
	}
	var out wide
	if err := codec.Decode(codec.MsgPack, b, &out); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if !out.At.Equal(in.At) || !out.Mid.Equal(in.Mid) || !out.Far.Equal(in.Far) {
		t.Errorf("times: %v %v %v", out.At, out.Mid, out.Far)
	}
	out.At, out.Mid, out.Far = in.At, in.Mid, in.Far
	if !reflect.DeepEqual(in, out) {
		t.Error("round trip changed the value")
	}
}

// Deep nesting is refused quickly, without exhausting the stack.
func TestMsgpackDeepNesting(t *testing.T) {
	data := append(bytes.Repeat([]byte{0x91}, 8<<20), 0xc0)
	start := time.Now()
	var v sample
	err := codec.Decode(codec.MsgPack, data, &v)
	if !errors.Is(err, codec.ErrMalformed) {
		t.Fatalf("Decode = %v, want ErrMalformed", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestEncodeError(t *testing.T) {
	for _, e := range []codec.Encoding{codec.JSON, codec.MsgPack} {
		if _, err := codec.Encode(e, make(chan int)); err == nil {
			t.Errorf("Encode(%v, chan) succeeded", e)
		}
	}
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
