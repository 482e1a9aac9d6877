package placement

import (
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/warmfleet/warmfleet/schemas"
)

// wantPlatform is the platform the Run needs: its own, else its image's.
func wantPlatform(req *Request, ref *imageRef, known bool) *schemas.Platform {
	if req.Run.Platform != nil {
		return req.Run.Platform
	}
	if known && ref.platform.OS != "" {
		return &ref.platform
	}
	return nil
}

// runsOn says whether a host runs build want: the same os and architecture
// once normalized (OCI's rules, as containerd applies them: arm64 is
// arm64/v8, arm is arm/v7, amd64/v1 is amd64), and a variant the host's own
// build accepts (arm/v7 runs v6 and v5, amd64/v3 runs v2 and v1). A host of
// another architecture never does, even where containerd would run it
// (arm on arm64, 386 on amd64): not every CPU of that architecture can.
func runsOn(host *schemas.HostFacts, want schemas.Platform) bool {
	if want.Variant == host.Variant && want.OS == host.OS && want.Architecture == host.Architecture {
		return true // the common case, without allocating matchers
	}
	h := platforms.Normalize(ocispec.Platform{OS: host.OS, Architecture: host.Architecture, Variant: host.Variant})
	w := platforms.Normalize(ocispec.Platform{OS: want.OS, Architecture: want.Architecture, Variant: want.Variant})
	return h.OS == w.OS && h.Architecture == w.Architecture && platforms.Only(h).Match(w)
}

func hostPlatform(h *schemas.HostFacts) schemas.Platform {
	return schemas.Platform{OS: h.OS, Architecture: h.Architecture, Variant: h.Variant}
}
