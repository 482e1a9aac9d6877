package containerd

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/content"
	"github.com/containerd/containerd/images"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// countingReader reports the bytes read through it; an archive import reads
// the file once from start to end, so that is the import's progress.
type countingReader struct {
	r     io.Reader
	n     int64
	total int64
	fn    func(done, total int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.fn(c.n, c.total)
	}
	return n, err
}

// pullProgress follows a registry pull: total grows as the handlers find
// blobs that are absent, done counts finished blobs, and a poller adds the
// bytes of downloads still open in the content store.
type pullProgress struct {
	total, done atomic.Int64
}

// wrap counts each absent blob's size into total before its fetch and into
// done after it.
func (p *pullProgress) wrap(cs content.Store) func(images.Handler) images.Handler {
	return func(next images.Handler) images.Handler {
		return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
			_, err := cs.Info(ctx, desc.Digest)
			absent := err != nil
			if absent {
				p.total.Add(desc.Size)
			}
			children, err := next.Handle(ctx, desc)
			if absent && err == nil {
				p.done.Add(desc.Size)
			}
			return children, err
		})
	}
}

// poll calls fn every interval until ctx ends.
func (p *pullProgress) poll(ctx context.Context, cs content.Store, every time.Duration, fn func(done, total int64)) {
	t := time.NewTicker(every)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		open := int64(0)
		if sts, err := cs.ListStatuses(ctx); err == nil {
			for _, st := range sts {
				open += st.Offset
			}
		}
		// A blob leaves the open downloads a moment before wrap counts it
		// done, so a sample can dip; what was reported stands.
		total := p.total.Load()
		last = max(last, min(p.done.Load()+open, total))
		fn(last, total)
	}
}
