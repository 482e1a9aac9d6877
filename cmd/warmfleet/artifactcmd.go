package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/artifacts"
	"github.com/warmfleet/warmfleet/schemas"
)

func newArtifactCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifact",
		Short: "Put, register, list, show and remove artifacts (model weights, datasets) in the catalog",
		Long: `Artifacts are immutable content named NAME:VERSION in the control plane's
catalog and identified by their sha256 digest. A Run mounts them read-only:
"artifacts": [{"name": "llama", "version": "v1", "path": "/models/llama"}]
(or "digest": "sha256:…", or neither for the newest version).`,
	}
	cmd.AddCommand(newArtifactPut(g), newArtifactRegister(g), newArtifactList(g), newArtifactGet(g), newArtifactRm(g))
	return cmd
}

// parseArtifactRef reads a NAME, NAME:VERSION or NAME@sha256:<hex>
// argument with the parser a prefetch's artifact is read with, quoting the
// argument in the refusal.
func parseArtifactRef(arg string) (schemas.ArtifactUse, error) {
	u, err := schemas.ParseArtifactRef("artifact", arg)
	if err != nil {
		return schemas.ArtifactUse{}, fmt.Errorf("%q: %w", arg, err)
	}
	return u, nil
}

// defaultArtifactVersion is a version named for when it was made.
func defaultArtifactVersion(now time.Time) string { return now.UTC().Format("20060102T150405Z") }

// checkNameVersion checks --name and --version before anything is sent.
func checkNameVersion(name, version string) error {
	if name == "" {
		return errors.New("--name is required: the artifact's catalog name, e.g. --name llama-3-8b")
	}
	if !schemas.ValidArtifactName(name) {
		return fmt.Errorf("--name %q: lowercase [a-z0-9._-], 1-63 characters, starting with a letter or digit", name)
	}
	if schemas.ValidateArtifactVersion("version", version) != nil {
		return fmt.Errorf("--version %q: [A-Za-z0-9._-], 1-64 characters, starting with a letter or digit (default: the time, e.g. %s)", version, defaultArtifactVersion(time.Now()))
	}
	return nil
}

func checkDigestFlag(digest string, required bool) error {
	if digest == "" {
		if required {
			return errors.New("--digest is required: the content's sha256:<hex> (`sha256sum FILE` gives the hex)")
		}
		return nil
	}
	if schemas.ValidateSHA256("digest", digest) != nil {
		return fmt.Errorf("--digest %q: must be sha256:<64 lowercase hex digits>", digest)
	}
	return nil
}

func newArtifactPut(g *globals) *cobra.Command {
	var name, version, digest string
	var showProgress, shared bool
	cmd := &cobra.Command{
		Use:   "put FILE --name NAME [--version V] [--digest sha256:…]",
		Short: "Upload a file to the artifact bucket and register it as NAME:VERSION",
		Long: `Upload FILE into the control plane's artifact object store bucket as object
sha256/<hex> (content-addressed: versions with the same bytes share one
object) and register it as NAME:VERSION. With --digest, a file whose bytes
hash to anything else is refused and nothing is stored. --version defaults
to the time in UTC, e.g. 20261205T123456Z.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if version == "" {
				version = defaultArtifactVersion(time.Now())
			}
			if err := checkNameVersion(name, version); err != nil {
				return err
			}
			if err := checkDigestFlag(digest, false); err != nil {
				return err
			}
			f, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("put: %w", err)
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return fmt.Errorf("put: %w", err)
			}
			if !st.Mode().IsRegular() {
				return fmt.Errorf("put: %s is not a regular file: put one file (tar a directory first)", args[0])
			}
			if st.Size() > schemas.MaxArtifactBytes {
				return fmt.Errorf("put: %s is %s; an artifact is at most %s", args[0], schemas.FormatBytes(st.Size()), schemas.FormatBytes(schemas.MaxArtifactBytes))
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			var report func(int64)
			var bar *progressBar
			if showProgress || isTerminal(cmd.ErrOrStderr()) {
				bar = newProgressBar(cmd.ErrOrStderr(), args[0], st.Size(), isTerminal(cmd.ErrOrStderr()))
				report = bar.update
			}
			up, err := uploadArtifact(cmd.Context(), conn.NC, f, digest, report)
			if bar != nil {
				bar.finish()
			}
			if err != nil {
				return fmt.Errorf("put %s: %w", args[0], err)
			}
			rec := schemas.ArtifactRecord{Name: name, Version: version, Digest: up.Digest, SizeBytes: up.Size, Source: schemas.ArtifactSource{Object: up.Name},
				Tenant: g.tenant, Shared: shared}
			stored, err := admin[schemas.ArtifactRecord](cmd.Context(), conn, bus.SubjectArtifactRegister, schemas.ArtifactRegistration{Version: schemas.SchemaVersion, Record: rec})
			if err != nil {
				if !up.Reused {
					// The object is new and the catalog refused it: leave
					// nothing behind that no record names.
					dropObject(cmd.Context(), conn, up.Name)
				}
				return fmt.Errorf("register %s:%s: %w", name, version, err)
			}
			return showArtifact(g, cmd.OutOrStdout(), stored, up.Reused)
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "catalog name (lowercase [a-z0-9._-])")
	f.StringVar(&version, "version", "", "version (default: the time in UTC, e.g. 20261205T123456Z)")
	f.StringVar(&digest, "digest", "", "expected sha256:<hex>; a file that does not match is refused")
	f.BoolVar(&showProgress, "progress", false, "show upload progress on stderr even when it is not a terminal")
	f.BoolVar(&shared, "shared", false, "let every tenant's Runs use it (default: --tenant's only)")
	return cmd
}

// dropObject deletes an object this put made, best effort.
func dropObject(ctx context.Context, conn *bus.Conn, object string) {
	obs, err := conn.JS.ObjectStore(ctx, bus.ObjectBucketArtifacts)
	if err == nil {
		_ = obs.Delete(ctx, object)
	}
}

func newArtifactRegister(g *globals) *cobra.Command {
	var rec schemas.ArtifactRecord
	cmd := &cobra.Command{
		Use:   "register --name N [--version V] (--object OBJ | --url URL) --digest sha256:… --size BYTES [--tenant T] [--shared]",
		Short: "Register content already in the artifact bucket (nats object put) or at an HTTP(S) URL",
		Long: `Register content as NAME:VERSION without uploading it: --object names an
object already in the ` + bus.ObjectBucketArtifacts + ` bucket (checked against its digest
and size), --url an HTTP(S) URL nodes fetch it from (verified by each node
against --digest). A URL carries no credential: the control plane holds those.
The record belongs to --tenant: only that tenant's Runs may mount it, unless
--shared lets every tenant's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rec.Tenant = g.tenant
			if rec.Version == "" {
				rec.Version = defaultArtifactVersion(time.Now())
			}
			if err := checkNameVersion(rec.Name, rec.Version); err != nil {
				return err
			}
			if (rec.Source.Object == "") == (rec.Source.URL == "") {
				return errors.New("give exactly one of --object (an object in the " + bus.ObjectBucketArtifacts + " bucket) and --url (an http(s) URL)")
			}
			if err := checkDigestFlag(rec.Digest, true); err != nil {
				return err
			}
			if rec.SizeBytes < 0 {
				return errors.New("--size is required: the content's size in bytes")
			}
			if err := rec.Validate(); err != nil {
				return flagError(err)
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			stored, err := admin[schemas.ArtifactRecord](cmd.Context(), conn, bus.SubjectArtifactRegister, schemas.ArtifactRegistration{Version: schemas.SchemaVersion, Record: rec})
			if err != nil {
				return fmt.Errorf("register %s:%s: %w", rec.Name, rec.Version, flagError(err))
			}
			return showArtifact(g, cmd.OutOrStdout(), stored, false)
		},
	}
	f := cmd.Flags()
	f.StringVar(&rec.Name, "name", "", "catalog name (lowercase [a-z0-9._-])")
	f.StringVar(&rec.Version, "version", "", "version (default: the time in UTC)")
	f.StringVar(&rec.Source.Object, "object", "", "object name in the "+bus.ObjectBucketArtifacts+" bucket")
	f.StringVar(&rec.Source.URL, "url", "", "http(s) URL of the content, without credentials")
	f.StringVar(&rec.Digest, "digest", "", "the content's sha256:<hex>")
	f.Int64Var(&rec.SizeBytes, "size", -1, "the content's size in bytes")
	f.BoolVar(&rec.Shared, "shared", false, "let every tenant's Runs use it (default: --tenant's only)")
	return cmd
}

// flagError names the flag a refusal's record field came from.
func flagError(err error) error {
	var ref *schemas.Refusal
	if !errors.As(err, &ref) {
		return err
	}
	flag := map[string]string{"name": "--name", "version": "--version", "digest": "--digest", "size_bytes": "--size",
		"source": "--object/--url", "source.object": "--object", "source.url": "--url", "tenant": "--tenant", "shared": "--shared"}[ref.Field]
	if flag == "" {
		return err
	}
	return fmt.Errorf("%s: %w", flag, err)
}

// showArtifact prints a record just stored.
func showArtifact(g *globals, w io.Writer, r schemas.ArtifactRecord, reused bool) error {
	if g.output == "json" {
		return g.render(w, r, nil)
	}
	how := "uploaded"
	if reused {
		how = "already in the bucket"
	}
	if r.Source.URL != "" {
		how = "at " + r.Source.URL
	} else {
		how = "object " + r.Source.Object + ", " + how
	}
	owner := "tenant " + r.TenantOf()
	if r.Shared {
		owner += ", shared with every tenant"
	}
	fmt.Fprintf(w, "registered %s:%s %s (%s; %s; %s)\n", r.Name, r.Version, r.Digest, schemas.FormatBytes(r.SizeBytes), how, owner)
	return nil
}

// openCatalog reads the catalog directly (operators may read its buckets).
func openCatalog(ctx context.Context, conn *bus.Conn) (*artifacts.Catalog, error) {
	cat, err := artifacts.Open(ctx, conn.JS, time.Now, zap.NewNop())
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("no artifact catalog on this NATS server: `warmfleet serve` provisions it")
	}
	return cat, err
}

func newArtifactList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "list [NAME]", Short: "List the catalog, or one artifact's versions, oldest first", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
				if !schemas.ValidArtifactName(name) {
					return fmt.Errorf("%q: the name must be lowercase [a-z0-9._-], 1-63 characters", name)
				}
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			cat, err := openCatalog(cmd.Context(), conn)
			if err != nil {
				return err
			}
			rs, err := cat.List(cmd.Context(), name)
			if err != nil {
				return err
			}
			if rs == nil {
				rs = []schemas.ArtifactRecord{}
			}
			return g.render(cmd.OutOrStdout(), rs, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tVERSION\tTENANT\tSHARED\tDIGEST\tSIZE\tSOURCE\tCREATED")
				for _, r := range rs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%s\t%s\t%s\n", r.Name, r.Version, r.TenantOf(), r.Shared, shortDigest(r.Digest),
						schemas.FormatBytes(r.SizeBytes), sourceOf(r.Source), fmtTime(&r.CreatedAt))
				}
			})
		},
	}
}

// shortDigest is sha256: and the first 12 hex digits.
func shortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

func sourceOf(s schemas.ArtifactSource) string {
	if s.URL != "" {
		return s.URL
	}
	return "object " + s.Object
}

func newArtifactGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME[:VERSION] | NAME@sha256:<hex>",
		Short: "Show one artifact version's record as JSON (the newest without a version)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := parseArtifactRef(args[0])
			if err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			cat, err := openCatalog(cmd.Context(), conn)
			if err != nil {
				return err
			}
			version := ref.Version
			if version == "" {
				// The newest, or the one with the digest, as intake resolves a use.
				ms, err := cat.Resolve(cmd.Context(), g.tenant, []schemas.ArtifactUse{{Name: ref.Name, Digest: ref.Digest}})
				if err != nil {
					return fmt.Errorf("%s: %w", ref.Ref(), err)
				}
				version = ms[0].Version
			}
			r, err := cat.Get(cmd.Context(), ref.Name, version)
			if err != nil {
				return fmt.Errorf("%s: %w", ref.Ref(), err)
			}
			out := *g
			out.output = "json"
			return out.render(cmd.OutOrStdout(), r, nil)
		},
	}
}

func newArtifactRm(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME:VERSION",
		Short: "Remove one version from the catalog, and its object when no other version holds the same bytes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := parseArtifactRef(args[0])
			if err != nil {
				return err
			}
			if ref.Version == "" {
				return fmt.Errorf("%q: rm takes NAME:VERSION, one version at a time (`warmfleet artifact list %s` shows them)", args[0], ref.Name)
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			r, err := admin[schemas.ArtifactRecord](cmd.Context(), conn, bus.SubjectArtifactRemove,
				schemas.ArtifactRemoval{Version: schemas.SchemaVersion, Name: ref.Name, ArtifactVersion: ref.Version})
			if err != nil {
				return fmt.Errorf("rm %s: %w", ref.Ref(), err)
			}
			if g.output == "json" {
				return g.render(cmd.OutOrStdout(), r, nil)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s:%s (%s)\n", r.Name, r.Version, r.Digest)
			return nil
		},
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar shows an upload's bytes, share and rate: redrawn in place on
// a terminal, else a line at most every few seconds.
type progressBar struct {
	w           io.Writer
	label       string
	total       int64
	tty         bool
	start, last time.Time
	done        int64
}

func newProgressBar(w io.Writer, label string, total int64, tty bool) *progressBar {
	now := time.Now()
	return &progressBar{w: w, label: label, total: total, tty: tty, start: now, last: now}
}

func (p *progressBar) update(done int64) {
	p.done = done
	every := 3 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	if now := time.Now(); now.Sub(p.last) >= every {
		p.last = now
		p.draw()
	}
}

func (p *progressBar) draw() {
	secs := max(time.Since(p.start).Seconds(), 1e-3)
	pct := 100.0
	if p.total > 0 {
		pct = 100 * float64(p.done) / float64(p.total)
	}
	line := fmt.Sprintf("%s: %s / %s (%.0f%%), %s/s", p.label, schemas.FormatBytes(p.done), schemas.FormatBytes(p.total), pct, schemas.FormatBytes(int64(float64(p.done)/secs)))
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", line)
		return
	}
	fmt.Fprintln(p.w, line)
}

// finish draws the last state and ends the line.
func (p *progressBar) finish() {
	p.draw()
	if p.tty {
		fmt.Fprintln(p.w)
	}
}
