package queue

import (
	"hash"
	"hash/fnv"
	"strconv"

	"github.com/warmfleet/warmfleet/schemas"
)

// Shape is what decides whether a Run fits a node at all, whatever its
// image: resources, GPU requirement, platform, network and whether it
// mounts caches. Two waiting Runs of one shape are refused by the same
// nodes, so once one finds no node in a pass, the other need not be asked.
type Shape uint64

// ShapeOf is req's Shape.
func ShapeOf(req schemas.RunRequest) Shape {
	h := fnv.New64a()
	res := req.Resources
	for _, v := range []int64{res.CPUMillis, res.MemoryBytes, res.GPUCount, res.DiskBytes, int64(len(req.Caches))} {
		writeString(h, strconv.FormatInt(v, 10))
		h.Write([]byte{0})
	}
	if g := req.GPU; g != nil {
		writeString(h, g.Model+"\x00"+strconv.FormatInt(g.MinMemoryBytes, 10)+"\x00"+g.MinDriverCapability)
	}
	h.Write([]byte{1})
	if p := req.Platform; p != nil {
		writeString(h, p.String())
	}
	h.Write([]byte{1})
	writeString(h, req.Network)
	return Shape(h.Sum64())
}

func writeString(h hash.Hash64, s string) { h.Write([]byte(s)) }
