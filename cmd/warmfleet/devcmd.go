package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/warmfleet/warmfleet/internal/ociimage"
)

// newDevCmd holds helpers for trying warmfleet on one machine without a
// registry.
func newDevCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "dev", Short: "Local development helpers", Hidden: true}
	var dir, name string
	img := &cobra.Command{
		Use:   "busybox-image",
		Short: "Build a busybox OCI archive into an agent's --image-dir and print its pinned reference",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			im, err := ociimage.BuildBusybox(dir, name, nil)
			if err != nil {
				return fmt.Errorf("build image (is busybox-static installed? apt-get install -y busybox-static): %w", err)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), im.Reference)
			return err
		},
	}
	img.Flags().StringVar(&dir, "dir", ".warmfleet/images", "directory to write <digest>.tar into")
	img.Flags().StringVar(&name, "name", "busybox", "repository name under localhost/")
	cmd.AddCommand(img, newHostImageCmd())
	return cmd
}

// newHostImageCmd builds an image of host programs with the libraries they
// load: for programs a CDI spec mounts from the host, such as nvidia-smi,
// which need glibc in the image (scripts/gpu-smoke.sh uses it).
func newHostImageCmd() *cobra.Command {
	var dir, name string
	var programs []string
	cmd := &cobra.Command{
		Use:   "host-image",
		Short: "Build an OCI archive of /bin/sh and host programs with their libraries (ldd) into an agent's --image-dir; print its pinned reference",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			files, err := ociimage.WithLibraries(append([]string{"/bin/sh"}, programs...)...)
			if err != nil {
				return err
			}
			im, err := ociimage.BuildFromHost(dir, name, files)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), im.Reference)
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", ".warmfleet/images", "directory to write <digest>.tar into")
	cmd.Flags().StringVar(&name, "name", "host", "repository name under localhost/")
	cmd.Flags().StringArrayVar(&programs, "program", nil, "absolute path of a host program to include with its libraries (repeatable)")
	return cmd
}
