package main

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/leases"
	"github.com/containerd/containerd/namespaces"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
)

// dropAndCheck deletes the images pinned by manifests in every namespace
// given, collects, and checks that each layer in gone has neither content
// nor unpacked snapshot left anywhere, and that each in kept still has its
// content. A container still being removed can hold a snapshot for a
// moment, so the collection is repeated (bounded) until the check passes.
func dropAndCheck(ctx context.Context, address string, manifests []digest.Digest, gone, kept []familyLayer, nss ...string) error {
	for _, m := range manifests {
		if err := dropImage(ctx, address, m, nss...); err != nil {
			return err
		}
	}
	client, err := containerd.New(address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer client.Close()
	var last error
	for range 40 {
		if last = checkLayers(ctx, client, gone, kept, nss); last == nil {
			return nil
		}
		// Collect again: a lease deleted synchronously runs the collector.
		lctx := namespaces.WithNamespace(ctx, nss[0])
		l, err := client.LeasesService().Create(lctx, leases.WithRandomID())
		if err != nil {
			return err
		}
		if err := client.LeasesService().Delete(lctx, l, leases.SynchronousDelete); err != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("the next pull would not be cold: %w", last)
}

// familyLayer is a layer and the chain ID of its unpacked snapshot.
type familyLayer struct {
	digest, chain digest.Digest
}

func layersOf(img familyImage, from int) []familyLayer {
	diffs := make([]digest.Digest, len(img.diffIDs))
	for i, d := range img.diffIDs {
		diffs[i] = digest.Digest(d.String())
	}
	chains := identity.ChainIDs(diffs)
	var out []familyLayer
	for i := from; i < len(img.layers); i++ {
		out = append(out, familyLayer{digest: digest.Digest(img.layers[i].String()), chain: chains[i]})
	}
	return out
}

func checkLayers(ctx context.Context, client *containerd.Client, gone, kept []familyLayer, nss []string) error {
	for _, ns := range nss {
		nctx := namespaces.WithNamespace(ctx, ns)
		for _, l := range gone {
			if _, err := client.ContentStore().Info(nctx, l.digest); !errdefs.IsNotFound(err) {
				return fmt.Errorf("layer %s still in namespace %s's content (%v)", l.digest, ns, err)
			}
			if _, err := client.SnapshotService(containerd.DefaultSnapshotter).Stat(nctx, l.chain.String()); !errdefs.IsNotFound(err) {
				return fmt.Errorf("layer %s still unpacked in namespace %s (%v)", l.digest, ns, err)
			}
		}
		for _, l := range kept {
			if _, err := client.ContentStore().Info(nctx, l.digest); err != nil {
				return fmt.Errorf("shared layer %s gone from namespace %s: %w", l.digest, ns, err)
			}
		}
	}
	return nil
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
