package schemas_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

var (
	digestA = "sha256:" + strings.Repeat("a", 64)
	digestB = "sha256:" + strings.Repeat("b", 64)
)

func TestRunRequestArtifacts(t *testing.T) {
	valid := schemas.RunRequest{RequestID: "r", Image: testImage,
		Caches:    []schemas.CacheMount{{Name: "pip", Path: "/cache"}},
		Artifacts: []schemas.ArtifactUse{{Name: "weights", Version: "v1", Path: "/data/w"}, {Name: "tok", Digest: digestA, Path: "/data/t"}, {Name: "latest", Path: "/data/l"}}}
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid artifacts refused: %v", err)
	}
	for _, tc := range []struct {
		name  string
		mod   func(*schemas.ArtifactUse)
		code  schemas.Code
		field string
	}{
		{"name", func(a *schemas.ArtifactUse) { a.Name = "Weights!" }, schemas.CodeInvalidArtifact, "artifacts[0].name"},
		{"both pins", func(a *schemas.ArtifactUse) { a.Digest = digestB }, schemas.CodeInvalidArtifact, "artifacts[0]"},
		{"version", func(a *schemas.ArtifactUse) { a.Version = "-v1" }, schemas.CodeInvalidArtifact, "artifacts[0].version"},
		{"digest", func(a *schemas.ArtifactUse) { a.Version, a.Digest = "", "sha256:ABC" }, schemas.CodeInvalidDigest, "artifacts[0].digest"},
		{"relative path", func(a *schemas.ArtifactUse) { a.Path = "data/w" }, schemas.CodeInvalidArtifact, "artifacts[0].path"},
		{"dotdot", func(a *schemas.ArtifactUse) { a.Path = "/data/../etc" }, schemas.CodeInvalidArtifact, "artifacts[0].path"},
		{"over a cache", func(a *schemas.ArtifactUse) { a.Path = "/cache" }, schemas.CodeInvalidArtifact, "artifacts[0].path"},
		{"over another artifact", func(a *schemas.ArtifactUse) { a.Path = "/data/t" }, schemas.CodeInvalidArtifact, "artifacts[1].path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := valid
			r.Artifacts = append([]schemas.ArtifactUse(nil), valid.Artifacts...)
			tc.mod(&r.Artifacts[0])
			err := r.Validate()
			if !errors.Is(err, &schemas.Refusal{Code: tc.code, Field: tc.field}) {
				t.Fatalf("Validate = %v, want %s on %q", err, tc.code, tc.field)
			}
		})
	}
	many := valid
	many.Artifacts = make([]schemas.ArtifactUse, schemas.MaxArtifacts+1)
	if err := many.Validate(); !errors.Is(err, &schemas.Refusal{Code: schemas.CodeTooManyItems, Field: "artifacts"}) {
		t.Fatalf("too many artifacts: %v", err)
	}
}

func TestArtifactSourceValidate(t *testing.T) {
	for _, tc := range []struct {
		src   schemas.ArtifactSource
		field string // "" accepted
	}{
		{schemas.ArtifactSource{Object: "sha256/" + strings.Repeat("a", 64)}, ""},
		{schemas.ArtifactSource{URL: "https://models.example.com/llama/weights.bin"}, ""},
		{schemas.ArtifactSource{URL: "http://127.0.0.1:8080/w"}, ""},
		{schemas.ArtifactSource{}, "s"},
		{schemas.ArtifactSource{Object: "o", URL: "https://x/"}, "s"},
		{schemas.ArtifactSource{Object: "../etc"}, "s.object"},
		{schemas.ArtifactSource{URL: "ftp://x/w"}, "s.url"},
		{schemas.ArtifactSource{URL: "https:///w"}, "s.url"},
		{schemas.ArtifactSource{URL: "https://user:secret@models.example.com/w"}, "s.url"},
		{schemas.ArtifactSource{URL: "https://bucket.s3.example.com/w?X-Amz-Signature=secret"}, "s.url"},
	} {
		err := tc.src.Validate("s")
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v refused: %v", tc.src, err)
		case tc.field != "" && !errors.Is(err, &schemas.Refusal{Code: schemas.CodeInvalidArtifact, Field: tc.field}):
			t.Errorf("%+v: %v, want invalid_artifact on %s", tc.src, err, tc.field)
		case err != nil && strings.Contains(err.Error(), "secret"):
			t.Errorf("refusal echoes the credential: %v", err)
		}
	}
}

func TestObjectStoreDigest(t *testing.T) {
	// sha256 of the empty string, as the NATS object store writes it.
	if got := schemas.ObjectStoreDigest("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"); got != "SHA-256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=" {
		t.Fatalf("ObjectStoreDigest = %q", got)
	}
	if got := schemas.ObjectStoreDigest("sha512:abc"); got != "" {
		t.Fatalf("non-sha256 digest converted to %q", got)
	}
}

// A node that did not enumerate says nothing of its replicas; malformed
// replicas are dropped where facts enter the control plane.
func TestArtifactFactsNormalize(t *testing.T) {
	f := schemas.NodeFacts{Artifacts: &schemas.ArtifactInventory{Enumerated: false, Replicas: []schemas.ArtifactReplica{{Digest: digestA}}}}
	f.Normalize()
	if held, enumerated := f.ArtifactsOf(); enumerated || len(held) != 0 || len(f.Artifacts.Replicas) != 0 {
		t.Fatalf("unenumerated inventory kept: %+v", f.Artifacts)
	}
	f = schemas.NodeFacts{Artifacts: &schemas.ArtifactInventory{Enumerated: true, Replicas: []schemas.ArtifactReplica{{Digest: digestA, SizeBytes: 5}, {Digest: "md5:x"}, {Digest: digestB, SizeBytes: -1}}}}
	f.Normalize()
	held, enumerated := f.ArtifactsOf()
	if !enumerated || len(held) != 1 || held[digestA].SizeBytes != 5 {
		t.Fatalf("normalized inventory %+v", f.Artifacts)
	}
}

func TestArtifactCredentialNeverPrintsItsSecret(t *testing.T) {
	for _, c := range []schemas.ArtifactCredential{
		{Digest: digestA, Login: &schemas.ArtifactLogin{User: "artifact-n1", Token: "tok-secret"}},
		{Digest: digestA, Headers: map[string]string{"Authorization": "Bearer hdr-secret"}},
	} {
		for _, s := range []string{c.String(), c.GoString()} {
			if strings.Contains(s, "secret") {
				t.Fatalf("credential printed its secret: %s", s)
			}
		}
	}
}
