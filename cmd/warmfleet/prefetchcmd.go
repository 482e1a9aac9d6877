package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/schemas"
)

// localityWait is how long a finished prefetch waits for its ready nodes'
// facts to list the image or artifact: a node reports facts a few seconds
// after its holdings change.
const localityWait = 20 * time.Second

func newPrefetchCmd(g *globals) *cobra.Command {
	var req schemas.PrefetchRequest
	var timeout time.Duration
	var noWait bool
	cmd := &cobra.Command{
		Use:   "prefetch (--image REF | --artifact NAME[:VERSION|@sha256:HEX]) [--nodes SELECTOR] [--count N]",
		Short: "Warm an image or an artifact on nodes before Runs need it; shows progress, then each node's locality",
		Long: `Warm an image (pinned by digest) or an artifact from the catalog on nodes
before Runs need it.

--image REF names an image pinned by digest: name@sha256:<hex>.
--artifact names a catalog artifact: NAME (its newest version, resolved
now), NAME:VERSION or NAME@sha256:<hex>. It goes only to nodes that declare
an artifact replica store; a node is done once it holds a verified replica.
Give exactly one of --image and --artifact.

--nodes SELECTOR picks nodes: comma-separated terms, each a node id or
key=value with key node, arch, os, gpu (part of a card model, any case) or
rental. Terms with the same key are alternatives; different keys must all
hold: "node-a,node-b", "gpu=H200,arch=amd64".
--count N takes the N best matching live nodes that lack the image or
artifact (an image partly held first, then the most free disk). Neither:
every live node.

--tenant T names whose prefetch it is: an image is pulled with T's registry
credentials (then the fleet's), an artifact must be T's own or shared.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req.Tenant = g.tenant
			if req.RequestID == "" {
				req.RequestID = fmt.Sprintf("cli-%d", time.Now().UnixNano())
			}
			req.TimeoutSeconds = int64(timeout / time.Second)
			if err := checkPrefetchRequest(&req); err != nil {
				return err
			}
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			p, err := admin[schemas.Prefetch](cmd.Context(), conn, bus.SubjectPrefetch, req)
			if err != nil {
				return fmt.Errorf("prefetch: %w", err)
			}
			out := cmd.OutOrStdout()
			if noWait {
				if g.output == "json" {
					return g.render(out, p, nil)
				}
				fmt.Fprintf(out, "prefetch %s of %s sent to %d node(s); `warmfleet prefetch get %s` shows it\n", p.ID, p.Content(), sent(p), p.ID)
				return nil
			}
			if g.output != "json" {
				fmt.Fprintf(out, "prefetch %s of %s on %d node(s)\n", p.ID, p.Content(), sent(p))
			}
			p, err = followPrefetch(cmd.Context(), conn, p, func(n schemas.PrefetchNode) {
				if g.output != "json" {
					fmt.Fprintln(out, progressLine(n))
				}
			})
			if err != nil {
				return err
			}
			return showPrefetch(cmd.Context(), g, out, conn, p, localityWait)
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "image pinned by digest: name@sha256:<hex>")
	f.StringVar(&req.Nodes, "nodes", "", "node selector (see above); default every live node")
	f.StringVar(&req.Artifact, "artifact", "", "catalog artifact: NAME, NAME:VERSION or NAME@sha256:<hex> (instead of --image)")
	f.IntVar(&req.Count, "count", 0, "the best N matching live nodes that lack the image or artifact")
	f.StringVar(&req.RequestID, "request-id", "", "idempotency key (default: generated)")
	f.DurationVar(&timeout, "timeout", schemas.DefaultPrefetchTimeout, "how long nodes have to finish; an entry still open then has failed")
	f.BoolVar(&noWait, "no-wait", false, "print the prefetch id and return at once")
	cmd.AddCommand(newPrefetchGet(g))
	return cmd
}

// checkPrefetchRequest validates a request built from flags; a refusal
// about what to warm names the flag the operator gave.
func checkPrefetchRequest(req *schemas.PrefetchRequest) error {
	switch {
	case req.Image != "" && req.Artifact != "":
		return errors.New("--image and --artifact exclude each other: prefetch one image or one artifact per command")
	case req.Image == "" && req.Artifact == "":
		return errors.New("name what to warm: --image NAME@sha256:<hex> or --artifact NAME[:VERSION|@sha256:<hex>]")
	}
	err := req.Validate()
	var r *schemas.Refusal
	if errors.As(err, &r) && (r.Field == "image" || r.Field == "artifact" || r.Field == "tenant") {
		return fmt.Errorf("--%s %q: %w", r.Field, map[string]string{"image": req.Image, "artifact": req.Artifact, "tenant": req.Tenant}[r.Field], err)
	}
	return err
}

func newPrefetchGet(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "get PREFETCH_ID", Short: "Show a prefetch: each node's state, then its locality for the image or artifact", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			p, err := getJSON[schemas.Prefetch](cmd.Context(), conn, bus.BucketPrefetch, args[0], "prefetch")
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("no prefetch %s (ids are pf-…; records go %s after their last change)", args[0], bus.PrefetchMaxAge)
			}
			if err != nil {
				return err
			}
			return showPrefetch(cmd.Context(), g, cmd.OutOrStdout(), conn, p, 0)
		},
	}
}

// sent counts the nodes a prefetch was sent to.
func sent(p schemas.Prefetch) int {
	n := 0
	for _, e := range p.Nodes {
		if e.State != schemas.PrefetchSkipped {
			n++
		}
	}
	return n
}

// followPrefetch watches a prefetch's record until it is finished (every
// entry finished, or its deadline passed), calling each with a node's entry
// whenever it shows something new.
func followPrefetch(ctx context.Context, conn *bus.Conn, p schemas.Prefetch, each func(schemas.PrefetchNode)) (schemas.Prefetch, error) {
	shown := map[string]string{}
	show := func(p schemas.Prefetch) {
		for _, n := range p.Nodes {
			if l := progressLine(n); shown[n.NodeID] != l {
				shown[n.NodeID] = l
				each(n)
			}
		}
	}
	show(p)
	if p.Finished(time.Now()) {
		return p, nil
	}
	kv, err := conn.JS.KeyValue(ctx, bus.BucketPrefetch)
	if err != nil {
		return p, err
	}
	w, err := kv.Watch(ctx, p.ID)
	if err != nil {
		return p, fmt.Errorf("watch prefetch %s: %w", p.ID, err)
	}
	defer func() { _ = w.Stop() }()
	deadline := time.NewTimer(time.Until(p.ExpiresAt))
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-deadline.C:
			return p, nil // Finished by its deadline; showPrefetch says which nodes timed out
		case e, ok := <-w.Updates():
			if !ok {
				return p, fmt.Errorf("watch prefetch %s: closed", p.ID)
			}
			if e == nil {
				continue // the end of the current value
			}
			if e.Operation() != jetstream.KeyValuePut {
				return p, fmt.Errorf("prefetch %s was removed", p.ID)
			}
			var q schemas.Prefetch
			if err := json.Unmarshal(e.Value(), &q); err != nil {
				return p, fmt.Errorf("prefetch %s: %w", p.ID, err)
			}
			p = q
			show(p)
			if p.Finished(time.Now()) {
				return p, nil
			}
		}
	}
}

// progressLine is one node's entry as the operator reads it.
func progressLine(n schemas.PrefetchNode) string {
	detail := ""
	switch {
	case n.State == schemas.PrefetchPulling && n.Progress != nil:
		detail = n.Progress.String()
	case n.State == schemas.PrefetchReady && n.Progress != nil && n.Progress.TotalBytes > 0:
		detail = schemas.FormatBytes(n.Progress.TotalBytes) + " fetched"
	case n.State == schemas.PrefetchFailed:
		detail = strings.TrimSpace(string(n.Code) + " " + n.Reason)
	case n.State == schemas.PrefetchSkipped:
		detail = n.Reason
	}
	return strings.TrimRight(fmt.Sprintf("%-20s %-8s %s", n.NodeID, n.State, detail), " ")
}

// PrefetchLocality is one node's outcome: its entry, and the image's (or
// artifact's) locality in its latest facts. An artifact is hot where the
// node's replicas list it, and has no platform.
type PrefetchLocality struct {
	NodeID   string                `json:"node_id"`
	State    schemas.PrefetchState `json:"state"`
	Reason   string                `json:"reason,omitempty"`
	Locality schemas.LocalityState `json:"locality,omitempty"`
	Platform *schemas.Platform     `json:"platform,omitempty"`
}

// prefetchView is what -o json prints.
type prefetchView struct {
	Prefetch schemas.Prefetch   `json:"prefetch"`
	Nodes    []PrefetchLocality `json:"nodes"`
}

// showPrefetch prints each node's state and locality for the image or
// artifact, after waiting up to wait for ready nodes' facts to list it. It returns an error
// naming every node that failed or timed out.
func showPrefetch(ctx context.Context, g *globals, out io.Writer, conn *bus.Conn, p schemas.Prefetch, wait time.Duration) error {
	now := time.Now()
	timedOut := p.TimedOut(now)
	var rows []PrefetchLocality
	var failed []string
	for _, n := range p.Nodes {
		row := PrefetchLocality{NodeID: n.NodeID, State: n.State, Reason: n.Reason}
		if n.State == schemas.PrefetchFailed && n.Code != "" {
			row.Reason = string(n.Code) + ": " + n.Reason
		}
		if timedOut && !n.State.Finished() {
			row.State, row.Reason = schemas.PrefetchFailed, string(schemas.CodePrefetchTimedOut)+": no answer from the node by "+p.ExpiresAt.UTC().Format(time.RFC3339)
		}
		if row.State == schemas.PrefetchFailed {
			failed = append(failed, "node "+n.NodeID+" failed: "+row.Reason)
		}
		rows = append(rows, row)
	}
	localities(ctx, conn, p, rows, wait)
	err := g.render(out, prefetchView{p, rows}, func(tw *tabwriter.Writer) {
		fmt.Fprintf(tw, "prefetch %s of %s, created %s\n", p.ID, p.Content(), p.CreatedAt.UTC().Format(time.RFC3339))
		fmt.Fprintln(tw, "NODE\tSTATE\tLOCALITY\tPLATFORM\tDETAIL")
		for _, r := range rows {
			loc, plat := "-", "-"
			if r.Locality != "" {
				loc = string(r.Locality)
			}
			if r.Platform != nil {
				plat = platformString(*r.Platform)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.NodeID, r.State, loc, plat, or(r.Reason, "-"))
		}
	})
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("prefetch %s: %s", p.ID, strings.Join(failed, "; "))
	}
	return nil
}

func platformString(p schemas.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// localities fills each row's locality from its node's facts in wf_nodes,
// polling up to wait for ready nodes' facts to list the content hot.
func localities(ctx context.Context, conn *bus.Conn, p schemas.Prefetch, rows []PrefetchLocality, wait time.Duration) {
	digest := p.ContentDigest()
	kv, err := conn.JS.KeyValue(ctx, bus.BucketNodes)
	if err != nil {
		return
	}
	deadline := time.Now().Add(wait)
	for {
		missing := false
		for i := range rows {
			r := &rows[i]
			if r.State == schemas.PrefetchSkipped || r.Locality == schemas.LocalityHot {
				continue
			}
			var rec schemas.NodeRecord
			if _, err := bus.GetJSON(ctx, kv, r.NodeID, &rec); err != nil || rec.Facts == nil {
				missing = missing || r.State == schemas.PrefetchReady
				continue
			}
			r.Locality, r.Platform = "", nil
			if p.Artifact != nil {
				if held, _ := rec.Facts.ArtifactsOf(); held != nil {
					if _, ok := held[digest]; ok {
						r.Locality = schemas.LocalityHot
					}
				}
			}
			for _, im := range rec.Facts.Images {
				if p.Artifact == nil && im.ManifestDigest == digest {
					r.Locality, r.Platform = im.State, &im.Platform
				}
			}
			if r.State == schemas.PrefetchReady && r.Locality != schemas.LocalityHot {
				missing = true
			}
		}
		if !missing || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}
