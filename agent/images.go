package agent

import (
	"context"
	"time"

	"github.com/warmfleet/warmfleet/noderuntime"
)

// ImageMetrics receives what making images ready costs
// (internal/metrics.AgentImages implements it).
type ImageMetrics interface {
	// CredentialAsked is one ask of the control plane for a registry
	// credential: how long the answer took, and whether one came.
	CredentialAsked(d time.Duration, answered bool)
	// ImageFetched is one EnsureImage that brought content onto the
	// machine: its source ("registry", "archive"), bytes and duration.
	ImageFetched(source string, bytes int64, d time.Duration)
}

// ensureImage is EnsureImage, timed for ImageMetrics when it fetched.
func (a *Agent) ensureImage(ctx context.Context, spec noderuntime.ImageSpec) (noderuntime.ImageResult, error) {
	start := time.Now()
	res, err := a.rt.EnsureImage(ctx, spec)
	if m := a.cfg.ImageMetrics; m != nil && err == nil && !res.AlreadyPresent {
		m.ImageFetched(res.Source, res.FetchedBytes, time.Since(start))
	}
	return res, err
}
