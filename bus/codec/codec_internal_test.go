package codec

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzCheckMsgpackLengths: the length check accepts exactly the values the
// msgpack library can walk (Skip reads every length and element without
// decoding), so it refuses no well-formed message.
func FuzzCheckMsgpackLengths(f *testing.F) {
	for _, v := range []any{
		nil, true, 1, -1, -33, 200, 70000, int64(-1 << 40), uint64(1 << 63), float32(1.5), 2.5,
		"", "short", string(make([]byte, 40)), string(make([]byte, 300)), []byte{1, 2, 3},
		[]any{1, "a", nil}, make([]int, 20), map[string]any{"a": []any{map[string]any{"b": 1}}},
	} {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkErr := checkMsgpackLengths(data)
		skipErr := msgpack.NewDecoder(bytes.NewReader(data)).Skip()
		if (checkErr == nil) != (skipErr == nil) {
			t.Fatalf("checkMsgpackLengths = %v, msgpack Skip = %v on %x", checkErr, skipErr, data)
		}
	})
}
