package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/warmfleet/warmfleet/agent/interruption"
)

// TestInterruptionFlags: one notice source at most, an http(s) URL, and
// headers only with a URL, each refusal naming its flag.
func TestInterruptionFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // refusal text, or the source's type
	}{
		{nil, "<nil>"},
		{[]string{"--interruption-notice-file=/run/notice"}, "interruption.File"},
		{[]string{"--interruption-notice-url=http://169.254.169.254/latest/meta-data/spot/instance-action"}, "interruption.URL"},
		{[]string{"--interruption-notice-file=/a", "--interruption-notice-url=http://x/"}, "give one"},
		{[]string{"--interruption-notice-url=file:///etc/passwd"}, "--interruption-notice-url"},
		{[]string{"--interruption-notice-url=http://x/", "--interruption-notice-header=Metadata-Flavor"}, "Name=value"},
		{[]string{"--interruption-notice-header=Metadata-Flavor=Google"}, "needs --interruption-notice-url"},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := addInterruptionFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		src, err := f.source()
		got := ""
		switch s := src.(type) {
		case nil:
			got = "<nil>"
		case interruption.File:
			got = "interruption.File"
		case interruption.URL:
			got = "interruption.URL"
			if len(c.args) > 1 && s.Header.Get("Metadata-Flavor") == "" {
				t.Errorf("%v: header lost", c.args)
			}
		}
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, c.want) {
			t.Errorf("%v: got %q, want %q", c.args, got, c.want)
		}
	}
}
