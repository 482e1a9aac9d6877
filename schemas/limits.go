package schemas

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/bus/codec"
)

// The limits on what a node sends: a whole message before it is decoded
// (MaxNodeMessageBytes), then every string, slice and map in it, by its
// wire field name (nodeFieldLimits), else by kind (DefaultNodeStringBytes,
// DefaultNodeItems). The Validate of every type a node publishes or
// answers with applies them through CheckNodeSizes, so a node cannot grow
// a record, an event or a replica's memory past them; a value over its
// limit is refused value_too_long or too_many_items, naming the field and
// the limit.
const (
	// MaxNodeMessageBytes is the largest message from a node that is
	// decoded at all: the NATS max_payload every shipped config sets.
	MaxNodeMessageBytes = 1 << 20
	// DefaultNodeStringBytes bounds a string field not in the table: a
	// name, an id, a version, a digest.
	DefaultNodeStringBytes = 1024
	// DefaultNodeItems bounds a slice or map field not in the table.
	DefaultNodeItems = 256
	// MaxReceiptMessageBytes is how much of a receipt's message enters an
	// event in WF_EVENTS; the rest is cut (TruncateText).
	MaxReceiptMessageBytes = 1024
)

// nodeFieldLimits is the table: the limit of each field that the defaults
// do not fit, in bytes for a string and in items for a slice or map. A
// field name means the same limit wherever it appears.
var nodeFieldLimits = map[string]int{
	// Free text: what an operator reads of a failure.
	"message":        MaxStringBytes,
	"failure_reason": MaxStringBytes,
	"reason":         MaxStringBytes,
	"stop_reason":    256,
	"code":           64,
	"failure_code":   64,
	// A session token is 32 random bytes, encoded.
	"session_token": 256,
	// What a node holds grows with its disk: images, layers, caches,
	// artifact replicas, the operations its journal remembers
	// (agent.DefaultJournalRetention is 4096), prune reports.
	"images":                MaxKeepItems,
	"layer_digests":         512,
	"layer_sizes":           512,
	"layer_diff_ids":        512,
	"caches":                MaxKeepItems,
	"replicas":              MaxFactArtifacts,
	"applied_operation_ids": 2 * 4096,
	"workloads":             1024,
	"removed":               MaxKeepItems,
	"kept":                  MaxKeepItems,
	"failed":                MaxKeepItems,
	// Cards and their devices.
	"cards":       MaxGPUCount,
	"mig_devices": MaxGPUCount,
	"cdi_devices": MaxGPUCount,
	"gpus":        MaxGPUCount,
	"devices":     1024,
	"spec_dirs":   64,
	// A session host's sessions, and its checkpoints' bytes.
	"data":        MaxCheckpointPieceBytes,
	"residencies": MaxKeepItems,
	"released":    MaxKeepItems,
	"gone":        MaxKeepItems,
	"failures":    MaxKeepItems,
	"unreleased":  64,
	"unwritten":   64,
}

// NodeFieldLimit is the limit of a field of a message from a node: its
// table entry, or the default of its kind.
func NodeFieldLimit(name string, kind reflect.Kind) int {
	if n, ok := nodeFieldLimits[name]; ok {
		return n
	}
	if kind == reflect.String {
		return DefaultNodeStringBytes
	}
	return DefaultNodeItems
}

// CheckNodeMessageSize refuses a message from a node larger than
// MaxNodeMessageBytes, before it is decoded.
func CheckNodeMessageSize(n int) error {
	if n > MaxNodeMessageBytes {
		return refuse(CodePayloadTooLarge, "", "a message from a node is at most %d bytes; this one is %d", MaxNodeMessageBytes, n)
	}
	return nil
}

// DecodeNodeMessage decodes data, a message from a node, into v within the
// limits on what a node sends: its size before decoding, strictly (an
// unknown field is refused), then v's Validate.
func DecodeNodeMessage(enc codec.Encoding, data []byte, v interface{ Validate() error }) error {
	if err := CheckNodeMessageSize(len(data)); err != nil {
		return err
	}
	if err := codec.Decode(enc, data, v); err != nil {
		return err
	}
	return v.Validate()
}

// CheckNodeSizes refuses the first string, slice or map in v (a struct or
// a pointer to one, as decoded from a node) over its limit, naming it by
// its wire path under prefix (e.g. "receipt.message", "facts.images[3]").
func CheckNodeSizes(prefix string, v any) error {
	return checkSizes(prefix, reflect.ValueOf(v), 0)
}

// maxDepth bounds the walk: no node message nests deeper.
const maxDepth = 16

func checkSizes(path string, v reflect.Value, depth int) error {
	if depth > maxDepth {
		return refuse(CodeMalformed, path, "nests deeper than %d levels", maxDepth)
	}
	name := path[strings.LastIndexByte(path, '.')+1:]
	if i := strings.IndexByte(name, '['); i >= 0 {
		name = name[:i]
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkSizes(path, v.Elem(), depth+1)
	case reflect.String:
		if max := NodeFieldLimit(name, reflect.String); v.Len() > max {
			return refuse(CodeValueTooLong, path, "%d bytes; the limit is %d", v.Len(), max)
		}
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice {
			if max := NodeFieldLimit(name, reflect.Slice); v.Len() > max {
				return refuse(CodeTooManyItems, path, "%d items; the limit is %d", v.Len(), max)
			}
		}
		if !hasSized(v.Type().Elem()) {
			return nil
		}
		for i := range v.Len() {
			if err := checkSizes(fmt.Sprintf("%s[%d]", path, i), v.Index(i), depth+1); err != nil {
				return err
			}
		}
	case reflect.Map:
		if max := NodeFieldLimit(name, reflect.Map); v.Len() > max {
			return refuse(CodeTooManyItems, path, "%d entries; the limit is %d", v.Len(), max)
		}
		it := v.MapRange()
		for it.Next() {
			k := fmt.Sprint(it.Key().Interface())
			if len(k) > DefaultNodeStringBytes {
				return refuse(CodeValueTooLong, path, "a key of %d bytes; the limit is %d", len(k), DefaultNodeStringBytes)
			}
			if err := checkSizes(path+"."+k, it.Value(), depth+1); err != nil {
				return err
			}
		}
	case reflect.Struct:
		for _, f := range wireFields(v.Type()) {
			p := f.name
			if path != "" {
				p = path + "." + f.name
			}
			if err := checkSizes(p, v.Field(f.index), depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

type wireField struct {
	index int
	name  string
}

var wireFieldsOf sync.Map // reflect.Type → []wireField

// wireFields are t's exported fields that can hold a sized value, by wire
// name (the json tag, as the codec names them).
func wireFields(t reflect.Type) []wireField {
	if fs, ok := wireFieldsOf.Load(t); ok {
		return fs.([]wireField)
	}
	var fs []wireField
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || tag == "-" || !hasSized(f.Type) {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		fs = append(fs, wireField{index: i, name: tag})
	}
	wireFieldsOf.Store(t, fs)
	return fs
}

// hasSized says whether a value of t can hold a string, slice or map.
func hasSized(t reflect.Type) bool {
	return hasSizedDepth(t, 0)
}

func hasSizedDepth(t reflect.Type, depth int) bool {
	if depth > maxDepth {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Slice, reflect.Map, reflect.Interface:
		return true
	case reflect.Pointer, reflect.Array:
		return hasSizedDepth(t.Elem(), depth+1)
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() && hasSizedDepth(f.Type, depth+1) {
				return true
			}
		}
	}
	return false
}

// TruncateText cuts s to at most max bytes, at a rune boundary, marking
// the cut with how many bytes were dropped, so a node's text cannot grow
// an event without bound.
func TruncateText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	// The marker is at most 3+20+11 bytes: "… [", a count, " bytes cut]".
	const reserve = 34
	cut := max - reserve
	if cut <= 0 {
		cut = max
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if cut+reserve > max {
		return s[:cut]
	}
	return s[:cut] + fmt.Sprintf("… [%d bytes cut]", len(s)-cut)
}
