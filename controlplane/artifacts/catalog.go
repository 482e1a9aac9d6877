// Package artifacts is the control plane's artifact catalog: the records
// in wf_artifacts (immutable name/version entries naming content by its
// sha256 digest), their check against the object store bucket that holds
// uploaded content, resolution of a Run's artifact uses into mounts at
// intake, and the operators' register and remove service
// (wf.admin.artifact.register, wf.admin.artifact.rm).
package artifacts

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// Catalog reads and changes wf_artifacts. Every change is a CAS: Create
// for a new version, a delete at the record's revision for a removal.
type Catalog struct {
	kv  jetstream.KeyValue
	obs jetstream.ObjectStore
	now func() time.Time
	log *zap.Logger
}

// NewCatalog returns the catalog over wf_artifacts (kv) and the artifact
// object store bucket (obs). now stamps CreatedAt.
func NewCatalog(kv jetstream.KeyValue, obs jetstream.ObjectStore, now func() time.Time, log *zap.Logger) *Catalog {
	if now == nil {
		now = time.Now
	}
	return &Catalog{kv: kv, obs: obs, now: now, log: log}
}

// Open opens wf_artifacts and the artifact object store bucket, which
// bus.Provision made, and returns the catalog over them.
func Open(ctx context.Context, js jetstream.JetStream, now func() time.Time, log *zap.Logger) (*Catalog, error) {
	kv, err := js.KeyValue(ctx, bus.BucketArtifacts)
	if err != nil {
		return nil, fmt.Errorf("artifacts: open %s: %w", bus.BucketArtifacts, err)
	}
	obs, err := js.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err != nil {
		return nil, fmt.Errorf("artifacts: open %s: %w", bus.ObjectBucketArtifacts, err)
	}
	return NewCatalog(kv, obs, now, log), nil
}

// refuse builds a coded refusal for an operator's or producer's input.
func refuse(code schemas.Code, field, format string, args ...any) *schemas.Refusal {
	return &schemas.Refusal{Code: code, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Register adds r to the catalog and returns the record as stored. A
// record for an object is checked against the object's own info: it must
// exist with r's digest and size. A URL source is taken as given; the node
// verifies what it fetches. The same name, version and content again
// returns the stored record; other content under a stored version is
// refused, as versions are immutable, and so is a version another tenant's
// record holds (CodeArtifactOwned). A record naming no tenant is
// DefaultTenant's.
func (c *Catalog) Register(ctx context.Context, r schemas.ArtifactRecord) (schemas.ArtifactRecord, error) {
	r.CreatedAt = time.Time{}
	if err := r.Validate(); err != nil {
		return r, err
	}
	r.Tenant = r.TenantOf()
	key := schemas.ArtifactKey(r.Name, r.Version)
	if stored, err := c.Get(ctx, r.Name, r.Version); err == nil {
		return sameContent(stored, r)
	} else if !errors.Is(err, ErrNotFound) {
		return r, err
	}
	if r.Source.Object != "" {
		if err := c.checkObject(ctx, r); err != nil {
			return r, err
		}
	}
	r.CreatedAt = c.now().UTC()
	if _, err := bus.CreateJSON(ctx, c.kv, key, r); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) { // registered meanwhile
			stored, gerr := c.Get(ctx, r.Name, r.Version)
			if gerr != nil {
				return r, gerr
			}
			return sameContent(stored, r)
		}
		return r, fmt.Errorf("artifacts: register %s: %w", key, err)
	}
	c.log.Info("artifact registered", zap.String("name", r.Name), zap.String("version", r.Version),
		zap.String("tenant", r.Tenant), zap.Bool("shared", r.Shared), zap.String("digest", r.Digest), zap.Int64("size_bytes", r.SizeBytes))
	return r, nil
}

// sameContent answers a registration of a version the catalog holds.
func sameContent(stored, r schemas.ArtifactRecord) (schemas.ArtifactRecord, error) {
	if stored.TenantOf() != r.TenantOf() {
		return stored, refuse(schemas.CodeArtifactOwned, "tenant",
			"%s version %s is tenant %s's; a catalog name and version belong to one tenant: register under another name or version, or register it shared from tenant %s",
			r.Name, r.Version, stored.TenantOf(), stored.TenantOf())
	}
	if stored.Shared != r.Shared {
		return stored, refuse(schemas.CodeInvalidArtifact, "shared",
			"%s version %s is registered with shared=%v; versions are immutable: register it under a new version to change that", r.Name, r.Version, stored.Shared)
	}
	if stored.Digest == r.Digest && stored.SizeBytes == r.SizeBytes && stored.Source == r.Source {
		return stored, nil
	}
	return stored, refuse(schemas.CodeInvalidArtifact, "version",
		"%s version %s is already registered with other content (%s); versions are immutable: register this content under a new version",
		r.Name, r.Version, stored.Digest)
}

// checkObject refuses a record whose object is missing, or holds other
// bytes than the record says.
func (c *Catalog) checkObject(ctx context.Context, r schemas.ArtifactRecord) error {
	info, err := c.obs.GetInfo(ctx, r.Source.Object)
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return refuse(schemas.CodeInvalidArtifact, "source.object",
			"no object %q in the object store bucket %s: upload it first (`warmfleet artifact put`, or `nats object put %s FILE --name %s`)",
			r.Source.Object, bus.ObjectBucketArtifacts, bus.ObjectBucketArtifacts, r.Source.Object)
	case err != nil:
		return fmt.Errorf("artifacts: object %s: %w", r.Source.Object, err)
	}
	if info.Digest != schemas.ObjectStoreDigest(r.Digest) {
		return refuse(schemas.CodeArtifactDigestMismatch, "digest",
			"object %q holds other bytes (object store digest %s) than digest %s: give the object's own sha256 digest, or upload the right file",
			r.Source.Object, info.Digest, r.Digest)
	}
	if int64(info.Size) != r.SizeBytes {
		return refuse(schemas.CodeInvalidArtifact, "size_bytes",
			"object %q holds %d bytes, not %d: give its size", r.Source.Object, info.Size, r.SizeBytes)
	}
	return nil
}

// ErrNotFound is the error of Get for a version the catalog does not
// hold; it is also a CodeArtifactUnknown refusal (errors.As).
var ErrNotFound = errors.New("artifacts: no such artifact version")

// notFound is a refusal that also matches ErrNotFound.
type notFound struct{ *schemas.Refusal }

func (n notFound) Unwrap() []error { return []error{n.Refusal, ErrNotFound} }

// Get returns one version's record.
func (c *Catalog) Get(ctx context.Context, name, version string) (schemas.ArtifactRecord, error) {
	var r schemas.ArtifactRecord
	key := schemas.ArtifactKey(name, version)
	_, err := bus.GetJSON(ctx, c.kv, key, &r)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return r, notFound{refuse(schemas.CodeArtifactUnknown, "version",
			"the catalog holds no %s version %s: `warmfleet artifact list %s` shows its versions", name, version, name)}
	case err != nil:
		return r, fmt.Errorf("artifacts: get %s: %w", key, err)
	}
	return r, nil
}

// List returns every record of name ("" for all), sorted by name, then
// by CreatedAt, then version.
func (c *Catalog) List(ctx context.Context, name string) ([]schemas.ArtifactRecord, error) {
	// A name may hold dots, which split KV subjects into tokens, so the
	// keys are listed and filtered here rather than by subject filter.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lister, err := c.kv.ListKeys(lctx)
	if err != nil {
		return nil, fmt.Errorf("artifacts: list: %w", err)
	}
	seen := map[string]bool{}
	var keys []string
	for k := range lister.Keys() {
		if (name == "" || strings.HasPrefix(k, name+"/")) && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]schemas.ArtifactRecord, 0, len(keys))
	for _, k := range keys {
		var r schemas.ArtifactRecord
		_, err := bus.GetJSON(ctx, c.kv, k, &r)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound): // removed meanwhile
			continue
		case err != nil:
			return nil, fmt.Errorf("artifacts: list: %w", err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b schemas.ArtifactRecord) int {
		if n := strings.Compare(a.Name, b.Name); n != 0 {
			return n
		}
		if n := a.CreatedAt.Compare(b.CreatedAt); n != 0 {
			return n
		}
		return strings.Compare(a.Version, b.Version)
	})
	return out, nil
}

// Newest returns name's newest version (the greatest CreatedAt).
func (c *Catalog) Newest(ctx context.Context, name string) (schemas.ArtifactRecord, error) {
	rs, err := c.List(ctx, name)
	if err != nil {
		return schemas.ArtifactRecord{}, err
	}
	if len(rs) == 0 {
		return schemas.ArtifactRecord{}, notFound{unknownName("name", name)}
	}
	return rs[len(rs)-1], nil
}

func unknownName(field, name string) *schemas.Refusal {
	return refuse(schemas.CodeArtifactUnknown, field,
		"the catalog holds no artifact named %s: `warmfleet artifact list` shows the catalog; `warmfleet artifact put` adds one", name)
}

// Remove deletes one version's record, at the revision it was read, and
// then its object, unless another record names the same object. It
// returns the record removed. A registration naming the object that races
// the deletion may be left naming a missing object; its Runs then fail to
// fetch, and putting the bytes again restores it under the same name.
func (c *Catalog) Remove(ctx context.Context, name, version string) (schemas.ArtifactRecord, error) {
	var r schemas.ArtifactRecord
	key := schemas.ArtifactKey(name, version)
	rev, err := bus.GetJSON(ctx, c.kv, key, &r)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrInvalidKey):
		return r, notFound{refuse(schemas.CodeArtifactUnknown, "artifact_version",
			"the catalog holds no %s version %s: `warmfleet artifact list %s` shows its versions", name, version, name)}
	case err != nil:
		return r, fmt.Errorf("artifacts: remove %s: %w", key, err)
	}
	if err := c.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		return r, fmt.Errorf("artifacts: remove %s: %w", key, err)
	}
	c.log.Info("artifact removed", zap.String("name", name), zap.String("version", version), zap.String("digest", r.Digest))
	if r.Source.Object == "" {
		return r, nil
	}
	rest, err := c.List(ctx, "")
	if err != nil {
		return r, fmt.Errorf("artifacts: removed %s, but could not check who else holds object %s: %w", key, r.Source.Object, err)
	}
	for _, o := range rest {
		if o.Source.Object == r.Source.Object {
			return r, nil // still referenced: content is shared by digest
		}
	}
	if err := c.obs.Delete(ctx, r.Source.Object); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return r, fmt.Errorf("artifacts: removed %s, but not its object %s: %w", key, r.Source.Object, err)
	}
	c.log.Info("artifact object deleted", zap.String("object", r.Source.Object))
	return r, nil
}

// Resolve answers a Run's (or prefetch's) artifact uses for tenant, in
// order: a version names that record, a digest the record of that name
// with that digest (the newest if several), neither the name's newest
// version; only records tenant may use count (its own and shared ones:
// ArtifactRecord.VisibleTo). A use the catalog cannot answer is refused
// (CodeArtifactUnknown) naming its field, in the same words whether the
// record is missing or another tenant's, so a refusal never tells one
// tenant what another holds; any other error is transient.
func (c *Catalog) Resolve(ctx context.Context, tenant string, uses []schemas.ArtifactUse) ([]schemas.ArtifactMount, error) {
	if len(uses) == 0 {
		return nil, nil
	}
	byName := map[string][]schemas.ArtifactRecord{}
	versions := func(name string) ([]schemas.ArtifactRecord, error) {
		if rs, ok := byName[name]; ok {
			return rs, nil
		}
		all, err := c.List(ctx, name)
		if err != nil {
			return nil, err
		}
		rs := slices.DeleteFunc(all, func(r schemas.ArtifactRecord) bool { return !r.VisibleTo(tenant) })
		byName[name] = rs
		return rs, nil
	}
	out := make([]schemas.ArtifactMount, 0, len(uses))
	for i, u := range uses {
		field := "artifacts[" + strconv.Itoa(i) + "]"
		var rec schemas.ArtifactRecord
		switch {
		case u.Version != "":
			r, err := c.Get(ctx, u.Name, u.Version)
			if err == nil && !r.VisibleTo(tenant) {
				err = ErrNotFound // another tenant's: answered as a missing one
			}
			if errors.Is(err, ErrNotFound) {
				rs, lerr := versions(u.Name)
				if lerr != nil {
					return nil, lerr
				}
				if len(rs) == 0 {
					return nil, unknownName(field+".name", u.Name)
				}
				return nil, refuse(schemas.CodeArtifactUnknown, field+".version",
					"the catalog holds no %s version %s (newest is %s): `warmfleet artifact list %s` shows its versions",
					u.Name, u.Version, rs[len(rs)-1].Version, u.Name)
			}
			if err != nil {
				return nil, err
			}
			rec = r
		default:
			rs, err := versions(u.Name)
			if err != nil {
				return nil, err
			}
			if len(rs) == 0 {
				return nil, unknownName(field+".name", u.Name)
			}
			rec = rs[len(rs)-1]
			if u.Digest != "" {
				found := false
				for _, r := range slices.Backward(rs) {
					if r.Digest == u.Digest {
						rec, found = r, true
						break
					}
				}
				if !found {
					return nil, refuse(schemas.CodeArtifactUnknown, field+".digest",
						"no version of %s has digest %s: `warmfleet artifact list %s` shows its versions and digests", u.Name, u.Digest, u.Name)
				}
			}
		}
		out = append(out, schemas.ArtifactMount{Name: rec.Name, Version: rec.Version, Digest: rec.Digest,
			SizeBytes: rec.SizeBytes, Source: rec.Source, Path: u.Path})
	}
	return out, nil
}
