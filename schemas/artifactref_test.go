package schemas_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/warmfleet/warmfleet/schemas"
)

const refDigest = "sha256:abababababababababababababababababababababababababababababababab"

// TestParseArtifactRef: the three forms parse and print back; anything
// else is refused naming the field, with the code of what is wrong.
func TestParseArtifactRef(t *testing.T) {
	for _, c := range []struct {
		in   string
		want schemas.ArtifactUse
	}{
		{"llama", schemas.ArtifactUse{Name: "llama"}},
		{"llama-3.1_8b:v1.0-rc1", schemas.ArtifactUse{Name: "llama-3.1_8b", Version: "v1.0-rc1"}},
		{"llama@" + refDigest, schemas.ArtifactUse{Name: "llama", Digest: refDigest}},
	} {
		got, err := schemas.ParseArtifactRef("artifact", c.in)
		if err != nil || got != c.want || got.Ref() != c.in {
			t.Errorf("%q: %+v %v, want %+v", c.in, got, err, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		code schemas.Code
	}{
		{"", schemas.CodeMissingField},
		{"Llama", schemas.CodeInvalidArtifact},
		{"llama:", schemas.CodeInvalidArtifact},
		{":v1", schemas.CodeInvalidArtifact},
		{"llama:v1@" + refDigest, schemas.CodeInvalidArtifact},
		{"llama@sha256:abc", schemas.CodeInvalidDigest},
		{"llama@" + strings.ToUpper(refDigest), schemas.CodeInvalidDigest},
		{"llama@", schemas.CodeInvalidDigest},
		{"llama:v1:v2", schemas.CodeInvalidArtifact},
		{"llama\x00", schemas.CodeInvalidArtifact},
		{strings.Repeat("a", 300), schemas.CodeInvalidArtifact},
	} {
		_, err := schemas.ParseArtifactRef("artifact", c.in)
		if !errors.Is(err, &schemas.Refusal{Code: c.code, Field: "artifact"}) {
			t.Errorf("%q: %v, want %s on artifact", c.in, err, c.code)
		}
	}
}

// TestPrefetchRequestNamesOneContent: a prefetch names an image or an
// artifact, never both or neither, and a malformed artifact is refused on
// its own field.
func TestPrefetchRequestNamesOneContent(t *testing.T) {
	image := "registry.example/m@" + refDigest
	for _, c := range []struct {
		name  string
		req   schemas.PrefetchRequest
		code  schemas.Code
		field string
	}{
		{"image", schemas.PrefetchRequest{RequestID: "r", Image: image}, "", ""},
		{"artifact", schemas.PrefetchRequest{RequestID: "r", Artifact: "llama:v1"}, "", ""},
		{"artifact by digest", schemas.PrefetchRequest{RequestID: "r", Artifact: "llama@" + refDigest, Count: 3}, "", ""},
		{"neither", schemas.PrefetchRequest{RequestID: "r"}, schemas.CodeMissingField, "image"},
		{"both", schemas.PrefetchRequest{RequestID: "r", Image: image, Artifact: "llama"}, schemas.CodeMalformed, "artifact"},
		{"bad artifact", schemas.PrefetchRequest{RequestID: "r", Artifact: "LLAMA"}, schemas.CodeInvalidArtifact, "artifact"},
		{"bad artifact digest", schemas.PrefetchRequest{RequestID: "r", Artifact: "llama@md5:00"}, schemas.CodeInvalidDigest, "artifact"},
		{"artifact, bad count", schemas.PrefetchRequest{RequestID: "r", Artifact: "llama", Count: -1}, schemas.CodeTooManyItems, "count"},
	} {
		err := c.req.Validate()
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.code != "" && !errors.Is(err, &schemas.Refusal{Code: c.code, Field: c.field}):
			t.Errorf("%s: %v, want %s on %q", c.name, err, c.code, c.field)
		}
	}
}

// TestPrefetchContent: an artifact prefetch is named and matched by its
// artifact's digest, an image prefetch by its manifest digest.
func TestPrefetchContent(t *testing.T) {
	m := schemas.ArtifactMount{Name: "llama", Version: "v1", Digest: refDigest, SizeBytes: 3, Source: schemas.ArtifactSource{Object: "llama/v1"}, Path: "/models"}
	p := schemas.Prefetch{Artifact: schemas.PrefetchArtifactOf(m)}
	if p.ContentDigest() != refDigest || p.Content() != "artifact llama:v1@"+refDigest {
		t.Errorf("artifact prefetch: %q %q", p.ContentDigest(), p.Content())
	}
	if back := p.Artifact.Mount(); back.Path != "" || back.Digest != m.Digest || back.Source != m.Source || back.SizeBytes != 3 {
		t.Errorf("mount %+v", back)
	}
	q := schemas.Prefetch{Image: "registry.example/m@" + refDigest, ManifestDigest: refDigest}
	if q.ContentDigest() != refDigest || q.Content() != q.Image {
		t.Errorf("image prefetch: %q %q", q.ContentDigest(), q.Content())
	}
}

// FuzzParseArtifactRef: the parser refuses or returns a use whose parts
// are each valid, pinned by at most one of version and digest, and that
// prints back to its input.
func FuzzParseArtifactRef(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		u, err := schemas.ParseArtifactRef("artifact", s)
		if err != nil {
			var r *schemas.Refusal
			if !errors.As(err, &r) || r.Field != "artifact" || r.Code == "" || r.Reason == "" {
				t.Fatalf("%q: not a refusal naming the field: %v", s, err)
			}
			return
		}
		if !utf8.ValidString(s) || !schemas.ValidArtifactName(u.Name) || (u.Version != "" && u.Digest != "") ||
			(u.Version != "" && schemas.ValidateArtifactVersion("v", u.Version) != nil) ||
			(u.Digest != "" && schemas.ValidateSHA256("d", u.Digest) != nil) || u.Path != "" {
			t.Fatalf("%q parsed to an invalid use %+v", s, u)
		}
		if u.Ref() != s {
			t.Fatalf("%q prints back as %q", s, u.Ref())
		}
		again, err := schemas.ParseArtifactRef("artifact", u.Ref())
		if err != nil || again != u {
			t.Fatalf("%q: reparse %+v %v", s, again, err)
		}
	})
}
