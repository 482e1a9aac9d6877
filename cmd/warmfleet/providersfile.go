package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/warmfleet/warmfleet/adapters/capacity/local"
	"github.com/warmfleet/warmfleet/adapters/capacity/runpodserverless"
	"github.com/warmfleet/warmfleet/controlplane/lane"
	"github.com/warmfleet/warmfleet/controlplane/rentals"
	"github.com/warmfleet/warmfleet/schemas"
)

// providerLine is one connection of a providers file (--providers-file):
// one JSON object per line; blank lines and lines starting with # are
// skipped. Settings are the type's own serve flags, by name ("shadeform-os",
// "local-cpu-millis", "fake-seed"); credentials only ever come from the
// credentials file.
type providerLine struct {
	ID              string                     `json:"id"`
	Type            string                     `json:"type"`
	CredentialsFile string                     `json:"credentials_file,omitempty"`
	MaxRentals      int                        `json:"max_rentals,omitempty"`
	OwnershipToken  string                     `json:"ownership_token,omitempty"`
	Settings        map[string]json.RawMessage `json:"settings,omitempty"`
	// Endpoints are a runpod-serverless connection's queue endpoints.
	Endpoints []runpodserverless.Endpoint `json:"endpoints,omitempty"`
	// line is where the file names it.
	line int
}

// credentialsFlag is, per type, the setting its credentials file fills;
// a type absent here takes none.
var credentialsFlag = map[string]string{"shadeform": "shadeform-api-key-file", "runpod": "runpod-api-key-file",
	runpodserverless.Type: "runpod-serverless-api-key-file"}

// laneTypes are the ephemeral executors a providers file may name: their
// connections serve the ephemeral lane, not rentals.
var laneTypes = []string{runpodserverless.Type}

// maxProvidersFile bounds a providers file.
const maxProvidersFile = 1 << 20

// ProvidersFileError is a providers file refused at a line.
type ProvidersFileError struct {
	Path  string
	Line  int
	Field string
	Err   error
}

func (e *ProvidersFileError) Error() string {
	where := e.Path + ":" + strconv.Itoa(e.Line)
	if e.Field != "" {
		where += ": " + e.Field
	}
	return "providers file " + where + ": " + e.Err.Error()
}

func (e *ProvidersFileError) Unwrap() error { return e.Err }

// parseProviders reads a providers file's lines, checking each: its id,
// its type, that the credentials file its type needs exists (and that a
// type that needs none has none), its limit and its settings' names. It
// returns the lines in file order.
func parseProviders(path string, data []byte) ([]providerLine, error) {
	var out []providerLine
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), maxProvidersFile)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		refuse := func(field string, format string, args ...any) error {
			return &ProvidersFileError{Path: path, Line: n, Field: field, Err: fmt.Errorf(format, args...)}
		}
		var pl providerLine
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&pl); err != nil {
			return nil, refuse("", "not a connection object (id, type, credentials_file, max_rentals, ownership_token, settings): %v", err)
		}
		if dec.More() {
			return nil, refuse("", "one connection object per line")
		}
		if err := schemas.ValidateID("id", pl.ID, schemas.CodeMalformed); err != nil {
			return nil, refuse("id", "%q: 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit", pl.ID)
		}
		if first, dup := seen[pl.ID]; dup {
			return nil, refuse("id", "%q is already the connection of line %d", pl.ID, first)
		}
		seen[pl.ID], pl.line = n, n
		if !slices.Contains(providerTypes, pl.Type) && !slices.Contains(laneTypes, pl.Type) {
			return nil, refuse("type", "%q is not a provider type; want %s (machines) or %s (the ephemeral lane)", pl.Type,
				strings.Join(providerTypes, ", "), strings.Join(laneTypes, ", "))
		}
		lane := slices.Contains(laneTypes, pl.Type)
		switch {
		case lane && len(pl.Endpoints) == 0:
			return nil, refuse("endpoints", "type %s needs its queue endpoints: [{\"id\": …, \"image\": \"name@sha256:…\", \"usd_per_second\": …}]", pl.Type)
		case !lane && len(pl.Endpoints) > 0:
			return nil, refuse("endpoints", "only an ephemeral executor (%s) has endpoints", strings.Join(laneTypes, ", "))
		case lane && pl.MaxRentals != 0:
			return nil, refuse("max_rentals", "type %s rents no machines", pl.Type)
		}
		for i, ep := range pl.Endpoints {
			if err := schemas.ValidateID("id", ep.ID, schemas.CodeMalformed); err != nil {
				return nil, refuse(fmt.Sprintf("endpoints[%d].id", i), "%q: 1-128 characters of [A-Za-z0-9._:-]", ep.ID)
			}
			if _, err := schemas.ParseImageRef("image", ep.Image); err != nil {
				return nil, refuse(fmt.Sprintf("endpoints[%d].image", i), "%q: the image its workers run, pinned as name@sha256:<hex>", ep.Image)
			}
			if !(ep.USDPerSecond >= 0) || ep.GPUCount < 0 || ep.CPUMillis < 0 || ep.MemoryBytes < 0 || ep.ColdStartSeconds < 0 || ep.MaxRuntimeSeconds < 0 {
				return nil, refuse(fmt.Sprintf("endpoints[%d]", i), "rates, sizes and seconds are not negative")
			}
		}
		switch flag, needs := credentialsFlag[pl.Type]; {
		case needs && pl.CredentialsFile == "":
			return nil, refuse("credentials_file", "type %s needs a credentials file (it fills --%s)", pl.Type, flag)
		case !needs && pl.CredentialsFile != "":
			return nil, refuse("credentials_file", "type %s takes no credentials", pl.Type)
		case needs:
			if st, err := os.Stat(pl.CredentialsFile); err != nil || !st.Mode().IsRegular() {
				why := "not a regular file"
				if err != nil {
					why = err.Error()
				}
				return nil, refuse("credentials_file", "%s (write the key there, readable by serve only)", why)
			}
		}
		if pl.MaxRentals < 0 {
			return nil, refuse("max_rentals", "%d: a limit is 0 (only the overall --max-rentals) or more", pl.MaxRentals)
		}
		if pl.OwnershipToken != "" {
			if err := schemas.ValidateID("ownership_token", pl.OwnershipToken, schemas.CodeMalformed); err != nil {
				return nil, refuse("ownership_token", "%q: 1-128 characters of [A-Za-z0-9._:-]", pl.OwnershipToken)
			}
		}
		for name := range pl.Settings {
			if !strings.HasPrefix(name, pl.Type+"-") || strings.Contains(name, "api-key") {
				return nil, refuse("settings."+name, "not a %s setting (settings are the %s-* serve flags; credentials come from credentials_file)", pl.Type, pl.Type)
			}
		}
		out = append(out, pl)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("providers file %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("providers file %s: no connections (one JSON object per line)", path)
	}
	return out, nil
}

// checkProvidersFile refuses, naming the line, a providers file that does
// not parse or check (its types, credentials files, settings' names), so
// serve stops before it starts anything; without one it checks nothing.
func (c *serveCapacity) checkProvidersFile(flags *pflag.FlagSet) error {
	if err := c.resolve(flags, os.Getenv); err != nil {
		return err
	}
	if c.providersFile == "" {
		return nil
	}
	data, err := readProvidersFile(c.providersFile)
	if err != nil {
		return err
	}
	_, err = parseProviders(c.providersFile, data)
	return err
}

// readProvidersFile reads a regular file of at most maxProvidersFile bytes.
func readProvidersFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("providers file: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxProvidersFile {
		return nil, fmt.Errorf("providers file %s: want a regular file of at most %d bytes", path, maxProvidersFile)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("providers file: %w", err)
	}
	return data, nil
}

// loadProviders reads a providers file and builds each connection's
// adapter from its settings, as serve's flags would: machine providers for
// the rental manager, ephemeral executors for the lane. Nothing is
// verified here: the rental manager verifies each of its connections, and
// one that fails is shown and skipped while the others serve.
func loadProviders(ctx context.Context, path, dataDir string, log *zap.Logger) (loaded, error) {
	data, err := readProvidersFile(path)
	if err != nil {
		return loaded{}, err
	}
	lines, err := parseProviders(path, data)
	if err != nil {
		return loaded{}, err
	}
	var out loaded
	fail := func(err error) (loaded, error) {
		for _, lp := range out.locals {
			err = errors.Join(err, shutdownLocal(lp))
		}
		return loaded{}, err
	}
	for _, pl := range lines {
		c, err := pl.settings(path)
		if err != nil {
			return fail(err)
		}
		if slices.Contains(laneTypes, pl.Type) {
			ex, err := runpodserverless.New(runpodserverless.Config{ConnectionID: pl.ID, BaseURL: c.rpsBaseURL, APIKeyFile: c.rpsKeyFile,
				Logger: log.Named("runpod-serverless"), Endpoints: pl.Endpoints})
			if err != nil {
				return fail(&ProvidersFileError{Path: path, Line: pl.line, Err: err})
			}
			out.lane = append(out.lane, lane.Connection{ID: pl.ID, Executor: ex, OwnershipToken: pl.OwnershipToken})
			continue
		}
		if c.localDir == "" {
			c.localDir = filepath.Join(dataDir, "machines", pl.ID)
		}
		p, lp, err := c.providerOf(ctx, dataDir, log.With(zap.String("connection_id", pl.ID)))
		if err != nil {
			return fail(&ProvidersFileError{Path: path, Line: pl.line, Err: err})
		}
		if lp != nil {
			out.locals = append(out.locals, lp)
		}
		out.rentals = append(out.rentals, rentals.Connection{ID: pl.ID, Provider: p, OwnershipToken: pl.OwnershipToken, MaxRentals: pl.MaxRentals})
	}
	return out, nil
}

// loaded is what a providers file configures.
type loaded struct {
	rentals []rentals.Connection
	lane    []lane.Connection
	locals  []*local.Provider
}

// settings is a serveCapacity for one line: serve's defaults, the line's
// settings, its credentials file and connection id.
func (pl providerLine) settings(path string) (*serveCapacity, error) {
	c := &serveCapacity{}
	cmd := &cobra.Command{}
	c.register(cmd)
	flags := cmd.Flags()
	for _, name := range slices.Sorted(maps.Keys(pl.Settings)) {
		if err := setFromJSON(flags, name, pl.Settings[name]); err != nil {
			return nil, &ProvidersFileError{Path: path, Line: pl.line, Field: "settings." + name, Err: err}
		}
	}
	if flag, ok := credentialsFlag[pl.Type]; ok {
		if err := flags.Set(flag, pl.CredentialsFile); err != nil {
			return nil, &ProvidersFileError{Path: path, Line: pl.line, Field: "credentials_file", Err: err}
		}
	}
	c.provider, c.connection = pl.Type, pl.ID
	return c, nil
}
