package artifactauth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmfleet/warmfleet/controlplane/artifactauth"
)

// The value every parse error must leave out.
const headerSecret = "Bearer s3cr3t-c0ffee"

func TestParseURLSource(t *testing.T) {
	src, err := artifactauth.ParseURLSource(`# models
https://models.example.com/ Authorization: ` + headerSecret + `
  https://models.example.com/private/ authorization: Bearer deeper
https://models.example.com/private/ x-team:  ml  
http://10.0.0.5:8080/data/	X-Token: t1
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		url  string
		want map[string]string
	}{
		{"https://models.example.com/a/b.bin", map[string]string{"Authorization": headerSecret}},
		{"https://models.example.com/private/x", map[string]string{"Authorization": "Bearer deeper", "X-Team": "ml"}},
		{"http://10.0.0.5:8080/data/x", map[string]string{"X-Token": "t1"}},
		// No host confusion: the prefix holds the path's first slash.
		{"https://models.example.com.evil.org/a", nil},
		{"http://models.example.com/a", nil},
		{"https://other.example.com/", nil},
	} {
		got := src.Headers(c.url)
		if len(got) != len(c.want) {
			t.Errorf("%s: %d headers, want %d", c.url, len(got), len(c.want))
			continue
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%s: header %s differs", c.url, k)
			}
		}
	}
	// A copy: the caller cannot change the source.
	src.Headers("https://models.example.com/a")["Authorization"] = "x"
	if src.Headers("https://models.example.com/a")["Authorization"] != headerSecret {
		t.Fatal("Headers returned the source's own map")
	}
	if p := src.Prefixes(); len(p) != 3 || p[0] != "https://models.example.com/private/" {
		t.Fatalf("prefixes %v, want longest first", p)
	}
	var nilSource *artifactauth.URLSource
	if nilSource.Headers("https://models.example.com/a") != nil {
		t.Fatal("a nil source gave headers")
	}
}

func TestParseURLSourceErrors(t *testing.T) {
	for _, c := range []struct {
		text      string
		line, col int
		reason    string
	}{
		{"https://a.example.com/", 1, 1, "want `<url-prefix>"},
		{"\n  ftp://a.example.com/ X: " + headerSecret, 2, 3, "http:// or https://"},
		{"https://a.example.com X: " + headerSecret, 1, 1, "path after the host"},
		{"https://u:p@a.example.com/ X: " + headerSecret, 1, 1, "userinfo"},
		{"https://a.example.com/?sig=1 X: " + headerSecret, 1, 1, "query"},
		{"https://a.example.com/   Bad Header: " + headerSecret, 1, 26, "header name"},
		{"https://a.example.com/ NoColon " + headerSecret, 1, 24, "Name: value"},
		{"https://a.example.com/ X-Empty:   ", 1, 35, "no value"},
		{"https://a.example.com/ X: " + headerSecret + "\x01z", 1, 27 + len(headerSecret), "control character"},
		{"https://a.example.com/ X: " + headerSecret + "\nhttps://a.example.com/ x: " + headerSecret, 2, 24, "twice"},
	} {
		_, err := artifactauth.ParseURLSource(c.text)
		var se *artifactauth.SourceSyntaxError
		if !errors.As(err, &se) {
			t.Errorf("%q: %v, want a SourceSyntaxError", c.text, err)
			continue
		}
		if se.Line != c.line || se.Column != c.col || !strings.Contains(se.Reason, c.reason) {
			t.Errorf("%q: %v, want line %d column %d: …%s…", c.text, err, c.line, c.col, c.reason)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: the error echoes the value: %v", c.text, err)
		}
	}
}

func TestLoadURLSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sources")
	if err := os.WriteFile(path, []byte("https://a.example.com/ Authorization: "+headerSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := artifactauth.LoadURLSource(path)
	if err != nil || src.Headers("https://a.example.com/x")["Authorization"] != headerSecret {
		t.Fatalf("load: %v", err)
	}
	if err := os.WriteFile(path, []byte("https://a.example.com/ Authorization "+headerSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := artifactauth.LoadURLSource(path); err == nil || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("malformed file: %v, want the path and no value", err)
	}
	if _, err := artifactauth.LoadURLSource(filepath.Join(dir, "absent")); err == nil {
		t.Fatal("an absent file loaded")
	}
}

// FuzzParseURLSource: any text is parsed or refused with a
// SourceSyntaxError inside the text that never holds a header's value;
// what is accepted gives only valid headers, for URLs under their prefix.
// Seeds are in testdata/fuzz/FuzzParseURLSource.
func FuzzParseURLSource(f *testing.F) {
	f.Add("https://models.example.com/ Authorization: Bearer xyz\n# c\n")
	f.Fuzz(func(t *testing.T, text string) {
		src, err := artifactauth.ParseURLSource(text)
		if err != nil {
			var se *artifactauth.SourceSyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a SourceSyntaxError", err)
			}
			lines := strings.Split(text, "\n")
			if se.Line < 1 || se.Line > len(lines) || se.Column < 1 || se.Column > len(lines[se.Line-1])+1 {
				t.Fatalf("position %d:%d outside the text", se.Line, se.Column)
			}
			// The reason may name a header and a prefix, never what follows
			// the colon.
			if _, v, ok := strings.Cut(lines[se.Line-1], ": "); ok && len(strings.TrimSpace(v)) > 8 && strings.Contains(se.Reason, strings.TrimSpace(v)) {
				t.Fatalf("the error holds the value: %v", err)
			}
			return
		}
		for _, p := range src.Prefixes() {
			h := src.Headers(p + "x")
			if len(h) == 0 {
				t.Fatalf("prefix %q gives no headers", p)
			}
			for k, v := range h {
				if k == "" || v == "" || strings.ContainsAny(v, "\r\n\x00") || strings.ContainsAny(k, " :\r\n") {
					t.Fatalf("header %q of prefix %q is not a valid header", k, p)
				}
			}
		}
	})
}
