package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestSessionInboxAckFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{args: nil},
		{args: []string{"--session-inbox-ack=written"}},
		{args: []string{"--session-inbox-ack=done"}},
		{args: []string{"--session-inbox-ack=never"}, err: `--session-inbox-ack "never": use done or written`},
	} {
		fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
		s := addSessionFlags(fs)
		args := append([]string{"--session-image=example.com/s@sha256:" + strings.Repeat("a", 64), "--session-compatibility-id=b1"}, tc.args...)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		h, err := s.host(t.TempDir())
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
		case err != nil || h == nil:
			t.Errorf("%v: host %v, err %v", tc.args, h, err)
		}
	}
}
