package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/bus"
	"github.com/warmfleet/warmfleet/controlplane/secrets"
	"github.com/warmfleet/warmfleet/schemas"
)

func newSecretCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Set, list and remove a tenant's sealed secrets; add and rotate the sealing key",
		Long: `A secret is a value of up to 64 KiB that the control plane keeps sealed
(NaCl secretbox under its key file) in the tenant's name, and that a Run
references by name: "secret_env": [{"name": "HF_TOKEN", "secret": "hf"}] or
"secret_files": [{"secret": "tls", "path": "/etc/tls/key.pem"}]. The agent
fetches the values at launch; they are never stored with the Run, in a
stream, in events or in logs. --tenant (WARMFLEET_TENANT) names the tenant;
a producer acts in its own only. Nothing here prints a value.`,
	}
	cmd.AddCommand(newSecretSet(g), newSecretList(g), newSecretRm(g), newSecretRotateKey(g), newSecretNewKey())
	return cmd
}

// secretRequest sends a per-tenant secret request in g.tenant and decodes
// its answer; a refusal names the flag or argument it is about.
func secretRequest[T any](ctx context.Context, g *globals, op string, req any) (T, error) {
	var zero T
	if err := schemas.ValidateTenant("tenant", g.tenant); err != nil {
		return zero, secretFlagError(err)
	}
	conn, err := g.connect(ctx)
	if err != nil {
		return zero, err
	}
	defer conn.Close()
	rep, err := admin[T](ctx, conn, bus.TenantSubject(g.tenant, op), req)
	if err != nil {
		return zero, tenantHint(g, secretFlagError(err))
	}
	return rep, nil
}

// secretFlagError says which flag or argument a refusal is about.
func secretFlagError(err error) error {
	var r *schemas.Refusal
	if !errors.As(err, &r) {
		return err
	}
	what := map[string]string{"tenant": "--tenant", "name": "NAME", "value": "the value (stdin or --from-file)"}[r.Field]
	if what == "" {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// tenantHint adds, to a request that got no answer, that a producer's
// login may ask in its own tenant only.
func tenantHint(g *globals, err error) error {
	var r *schemas.Refusal
	if errors.As(err, &r) || g.identity() == bus.OperatorUser {
		return err
	}
	return fmt.Errorf("%w (a producer may ask only in its own tenant: set --tenant or WARMFLEET_TENANT to it; this asked in %q)", err, g.tenant)
}

// readSecretValue reads a value from path, or stdin when path is empty,
// byte for byte (a trailing newline stays part of it), refusing an empty
// one or one over schemas.MaxSecretBytes.
func readSecretValue(stdin io.Reader, path string) ([]byte, error) {
	src, from := stdin, "stdin"
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %w", err)
		}
		defer f.Close()
		src, from = f, "--from-file "+path
	}
	v, err := io.ReadAll(io.LimitReader(src, schemas.MaxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	if len(v) == 0 {
		return nil, fmt.Errorf("%s: %w", from, &schemas.Refusal{Code: schemas.CodeMissingField, Field: "value",
			Reason: "the value is empty: pipe it in (`printf %s \"$TOKEN\" | warmfleet secret set NAME`) or pass --from-file"})
	}
	if len(v) > schemas.MaxSecretBytes {
		clear(v)
		return nil, fmt.Errorf("%s: %w", from, &schemas.Refusal{Code: schemas.CodeSecretTooLarge, Field: "value",
			Reason: fmt.Sprintf("a secret is at most %d bytes (put larger files in an artifact)", schemas.MaxSecretBytes)})
	}
	return v, nil
}

func newSecretSet(g *globals) *cobra.Command {
	var fromFile string
	cmd := &cobra.Command{
		Use:   "set NAME [--from-file F]",
		Short: "Seal a value as the tenant's secret NAME (from stdin, or --from-file; never from an argument)",
		Long: `Seal a value as the tenant's secret NAME, replacing the value it had. The
value is read from stdin (or --from-file F) byte for byte: a trailing
newline is kept as part of it (use printf '%s', not echo, to leave it out).
It is never taken from an argument, where ps and shell history would see it.
NAME is 1-64 characters of [A-Za-z0-9_-]; a value is 1 byte to 64 KiB.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := schemas.ValidateSecretName("name", args[0]); err != nil {
				return secretFlagError(err)
			}
			if fromFile == "" && isTerminal(cmd.ErrOrStderr()) {
				if f, ok := cmd.InOrStdin().(*os.File); ok && isTerminal(f) {
					fmt.Fprintln(cmd.ErrOrStderr(), "warmfleet: reading the value from stdin; end it with Ctrl-D (a newline typed before it is kept)")
				}
			}
			value, err := readSecretValue(cmd.InOrStdin(), fromFile)
			if err != nil {
				return err
			}
			defer clear(value)
			info, err := secretRequest[schemas.SecretInfo](cmd.Context(), g, bus.TenantSecretSet, schemas.SecretSetRequest{Version: schemas.SchemaVersion, Name: args[0], Value: value})
			if err != nil {
				return fmt.Errorf("secret set %s: %w", args[0], err)
			}
			if g.output == "json" {
				return g.render(cmd.OutOrStdout(), info, nil)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "secret %s of tenant %s set (%s, sealed under key %s)\n", info.Name, info.Tenant, schemas.FormatBytes(int64(info.Size)), info.KeyID)
			return nil
		},
	}
	cmd.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file instead of stdin (byte for byte)")
	return cmd
}

func newSecretList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the tenant's secrets: name, size, last change, sealing key (never a value)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := secretRequest[schemas.SecretListReply](cmd.Context(), g, bus.TenantSecretLs, schemas.SecretListRequest{Version: schemas.SchemaVersion})
			if err != nil {
				return fmt.Errorf("secret list: %w", err)
			}
			return g.render(cmd.OutOrStdout(), rep, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "NAME\tSIZE\tUPDATED\tKEY")
				for _, s := range rep.Secrets {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, schemas.FormatBytes(int64(s.Size)), s.UpdatedAt.Format(time.RFC3339), s.KeyID)
				}
			})
		},
	}
}

func newSecretRm(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove the tenant's secret NAME (a Run that names it is refused from then on)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := schemas.ValidateSecretName("name", args[0]); err != nil {
				return secretFlagError(err)
			}
			info, err := secretRequest[schemas.SecretInfo](cmd.Context(), g, bus.TenantSecretRm, schemas.SecretRemoveRequest{Version: schemas.SchemaVersion, Name: args[0]})
			if err != nil {
				return fmt.Errorf("secret rm %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "secret %s of tenant %s removed\n", info.Name, info.Tenant)
			return nil
		},
	}
}

func newSecretRotateKey(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rotate-key",
		Short: "Re-seal every secret of every tenant under the key file's first key (operators)",
		Long: `Re-seal every secret not sealed under the control plane's key file's first
key. Run it after 'warmfleet secret new-key'; once it reports no failure,
the old keys' lines can leave the key file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			conn, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer conn.Close()
			rep, err := admin[schemas.RotateKeyReply](cmd.Context(), conn, bus.SubjectSecretRotateKey, schemas.RotateKeyRequest{Version: schemas.SchemaVersion})
			if err != nil {
				return fmt.Errorf("secret rotate-key: %w", err)
			}
			if g.output == "json" {
				if err := g.render(cmd.OutOrStdout(), rep, nil); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "sealing key %s: %d re-sealed, %d already under it, %d failed\n", rep.KeyID, rep.Resealed, rep.Current, rep.Failed)
			}
			if rep.Failed > 0 {
				return fmt.Errorf("%d secrets open under no key of the key file (%v): keep the old keys' lines, or set those secrets again", rep.Failed, rep.FailedSecrets)
			}
			return nil
		},
	}
}

func newSecretNewKey() *cobra.Command {
	var keyFile string
	cmd := &cobra.Command{
		Use:   "new-key --key-file F",
		Short: "Put a fresh key first in the key file (made, 0600, when absent): it seals from then on",
		Long: `Put a fresh 32-byte key first in the key file F, replacing the file
atomically (0600). The control plane reads the file again when it changes:
it seals with the new key at once and still opens with the old ones. Then
run 'warmfleet secret rotate-key' and, once it reports no failure, remove
the old lines. With --nats-url replicas, copy the new file to every replica
before rotating. A missing F is created with one key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyFile == "" {
				return errors.New("--key-file is required: the control plane's key file (serve --secrets-key-file; default <data-dir>/secrets.key)")
			}
			created, err := secrets.EnsureKeyFile(keyFile)
			if err != nil {
				return fmt.Errorf("--key-file: %w", err)
			}
			if created {
				fmt.Fprintf(cmd.OutOrStdout(), "created %s with one key\n", keyFile)
				return nil
			}
			id, err := secrets.NewKey(keyFile)
			if err != nil {
				return fmt.Errorf("--key-file: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "key %s added first to %s: it seals from now on; next: warmfleet secret rotate-key, then remove the old lines\n", id, keyFile)
			return nil
		},
	}
	cmd.Flags().StringVar(&keyFile, "key-file", "", "the key file (serve --secrets-key-file)")
	return cmd
}
