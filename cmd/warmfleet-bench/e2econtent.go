package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	digest "github.com/opencontainers/go-digest"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
)

// imageRecorder is the agent's ImageMetrics in the bench: every credential
// ask and every fetch, in order.
type imageRecorder struct {
	mu          sync.Mutex
	credentials []time.Duration
	failedAsks  int
	fetches     []time.Duration
}

func (r *imageRecorder) CredentialAsked(d time.Duration, answered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !answered {
		r.failedAsks++
		return
	}
	r.credentials = append(r.credentials, d)
}

func (r *imageRecorder) ImageFetched(source string, _ int64, d time.Duration) {
	if source != "registry" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetches = append(r.fetches, d)
}

func (r *imageRecorder) snapshot() (creds, fetches []time.Duration, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.credentials...), append([]time.Duration(nil), r.fetches...), r.failedAsks
}

// dropImage deletes every record of the image pinned by dgst from each
// namespace and lets containerd's garbage collector free its content and
// snapshots before it returns, so the next pull is cold.
func dropImage(ctx context.Context, address string, dgst digest.Digest, nss ...string) error {
	client, err := containerd.New(address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer client.Close()
	type record struct{ ns, name string }
	var recs []record
	for _, ns := range nss {
		found, err := client.ImageService().List(namespaces.WithNamespace(ctx, ns), "target.digest=="+dgst.String())
		if err != nil {
			return err
		}
		for _, f := range found {
			recs = append(recs, record{ns, f.Name})
		}
	}
	for i, rec := range recs {
		var opts []images.DeleteOpt
		if i == len(recs)-1 { // the collection runs once, after the last
			opts = append(opts, images.SynchronousDelete())
		}
		if err := client.ImageService().Delete(namespaces.WithNamespace(ctx, rec.ns), rec.name, opts...); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	for _, ns := range nss {
		if _, err := client.ContentStore().Info(namespaces.WithNamespace(ctx, ns), dgst); err == nil {
			return fmt.Errorf("image %s survived its deletion in namespace %s: the next pull would not be cold", dgst, ns)
		}
	}
	return nil
}
