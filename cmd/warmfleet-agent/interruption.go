package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/pflag"

	"github.com/warmfleet/warmfleet/agent/interruption"
)

// interruptionFlags say where the agent looks for its provider's notice
// that the machine is being taken back (spot reclamation); with neither,
// it looks nowhere and the provider's own report is all there is.
type interruptionFlags struct {
	file, url string
	headers   []string
}

func addInterruptionFlags(f *pflag.FlagSet) *interruptionFlags {
	s := &interruptionFlags{}
	f.StringVar(&s.file, "interruption-notice-file", "", "a file whose appearance means the provider is taking this machine back (written by a host service); its content is the notice")
	f.StringVar(&s.url, "interruption-notice-url", "", "a metadata URL polled each heartbeat for the provider's notice: 404 or FALSE is none, any other 2xx body is one "+
		"(e.g. http://169.254.169.254/latest/meta-data/spot/instance-action, or GCE's instance/preempted with --interruption-notice-header Metadata-Flavor=Google)")
	f.StringArrayVar(&s.headers, "interruption-notice-header", nil, "Name=value header sent with each --interruption-notice-url look, repeatable")
	return s
}

// source builds the watch, or nil when none is configured.
func (s *interruptionFlags) source() (interruption.Source, error) {
	switch {
	case s.file != "" && s.url != "":
		return nil, fmt.Errorf("--interruption-notice-file and --interruption-notice-url: give one")
	case s.file != "":
		return interruption.File(s.file), nil
	case s.url == "":
		if len(s.headers) > 0 {
			return nil, fmt.Errorf("--interruption-notice-header needs --interruption-notice-url")
		}
		return nil, nil
	}
	u, err := url.Parse(s.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--interruption-notice-url %q: want an http(s) URL", s.url)
	}
	h := http.Header{}
	for _, kv := range s.headers {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--interruption-notice-header %q: want Name=value", kv)
		}
		h.Add(k, v)
	}
	return interruption.URL{Address: s.url, Header: h}, nil
}
