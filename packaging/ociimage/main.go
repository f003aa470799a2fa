//go:build linux || darwin

// Command ociimage builds and pushes fluksio-worker's container image: an
// OCI image index (linux/amd64, linux/arm64) whose images hold nothing but
// the static binary at /fluksio-worker. It is copied from, not run: by an
// init container (`/fluksio-worker copy DIR`) or by `COPY --from=` in a
// Dockerfile.
//
// GoReleaser runs it, see .goreleaser.yaml: `add` from each build's post
// hook, which puts that platform's binary into the OCI layout in dist/
// (no Docker daemon, no base image pulled: the base is empty), and `push`
// from a publisher, which sends the layout's index to the registry on a
// real release. kos: cannot do this (its snapshot writes to a Docker
// daemon, and it always pulls a base image).
//
//	go run ./packaging/ociimage add --layout dist/fluksio-worker_oci --binary dist/…/fluksio-worker \
//	    --os linux --arch amd64 --version 1.2.3 --created 1700000000
//	go run ./packaging/ociimage push --layout dist/fluksio-worker_oci --repository ghcr.io/fluksio/fluksio-worker --tag 1.2.3
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the binary lies in the image.
const BinaryPath = "/fluksio-worker"

// RefName is the OCI layout annotation naming the index (its tag).
const RefName = "org.opencontainers.image.ref.name"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ociimage add|push [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "add":
		err = add(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (add or push)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ociimage %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func add(args []string) error {
	fs := flag.NewFlagSet("add", flag.ContinueOnError)
	dir := fs.String("layout", "", "the OCI layout directory to add to (created if missing)")
	binary := fs.String("binary", "", "the static binary to put at "+BinaryPath)
	goos := fs.String("os", "", "the binary's GOOS")
	goarch := fs.String("arch", "", "the binary's GOARCH")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "the platforms the image holds; a build for any other is ignored")
	version := fs.String("version", "", "the version: the index's tag in the layout and its version annotation")
	created := fs.String("created", "0", "creation time, Unix seconds (the commit's, for reproducible images)")
	source := fs.String("source", "https://github.com/fluksio/fluksio-worker", "the source repository annotation")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *binary == "" || *goos == "" || *goarch == "" || *version == "" {
		return errors.New("--layout, --binary, --os, --arch and --version are required")
	}
	if !slices.Contains(strings.Split(*platforms, ","), *goos+"/"+*goarch) {
		return nil // a darwin build: not in the image
	}
	secs, err := strconv.ParseInt(*created, 10, 64)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	// A snapshot from an untagged checkout has no commit time (GoReleaser
	// gives the zero time): the epoch, then, still the same bytes each time.
	when := time.Unix(max(secs, 0), 0).UTC()
	annotations := map[string]string{
		"org.opencontainers.image.title":       "fluksio-worker",
		"org.opencontainers.image.description": "the fluksio-worker binary alone, at " + BinaryPath + ", to copy into another image",
		"org.opencontainers.image.version":     *version,
		"org.opencontainers.image.source":      *source,
		"org.opencontainers.image.licenses":    "MIT",
		"org.opencontainers.image.created":     when.Format(time.RFC3339),
	}

	img, err := binaryImage(*binary, *goos, *goarch, when, annotations)
	if err != nil {
		return err
	}

	// Each build target's hook runs this at once: one at a time here.
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(*dir)), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Clean(*dir)+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}

	images := map[string]v1.Image{*goos + "/" + *goarch: img}
	if old, err := readIndex(*dir); err == nil {
		m, err := old.IndexManifest()
		if err != nil {
			return err
		}
		for _, d := range m.Manifests {
			if d.Platform == nil {
				continue
			}
			key := d.Platform.OS + "/" + d.Platform.Architecture
			if _, ok := images[key]; ok {
				continue
			}
			if images[key], err = old.Image(d.Digest); err != nil {
				return err
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}

	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, key := range slices.Sorted(func(yield func(string) bool) {
		for k := range images {
			if !yield(k) {
				return
			}
		}
	}) {
		os, arch, _ := strings.Cut(key, "/")
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        images[key],
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: os, Architecture: arch}},
		})
	}
	idx = mutate.Annotations(idx, annotations).(v1.ImageIndex)
	top := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add:        idx,
		Descriptor: v1.Descriptor{Annotations: map[string]string{RefName: *version}},
	})

	// Written beside the old layout (whose blobs it may read), then swapped.
	tmp := filepath.Clean(*dir) + ".new"
	_ = os.RemoveAll(tmp)
	if _, err := layout.Write(tmp, top); err != nil {
		return err
	}
	if err := os.RemoveAll(*dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, *dir); err != nil {
		return err
	}
	digest, _ := idx.Digest()
	fmt.Printf("ociimage: %s/%s in %s (index %s)\n", *goos, *goarch, *dir, digest)
	return nil
}

// binaryImage is an image from an empty base with one layer: the binary,
// root-owned, mode 0755, at BinaryPath.
func binaryImage(binary, goos, goarch string, when time.Time, annotations map[string]string) (v1.Image, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     strings.TrimPrefix(BinaryPath, "/"),
		Mode:     0o755,
		Size:     int64(len(data)),
		ModTime:  when,
		Format:   tar.FormatPAX,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: when},
			CreatedBy: "fluksio-worker release build (packaging/ociimage)",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = goos, goarch
	cf.Created = v1.Time{Time: when}
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.Cmd = []string{"version"}
	// Not root: the init container only copies the binary out.
	cf.Config.User = "65532:65532"
	cf.Config.Labels = annotations
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, annotations).(v1.Image), nil
}

// readIndex opens the multi-platform index the layout's index.json names.
func readIndex(dir string) (v1.ImageIndex, error) {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, err
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("%s: index.json should name exactly one image index, names %d manifests", dir, len(m.Manifests))
	}
	return top.ImageIndex(m.Manifests[0].Digest)
}

func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	dir := fs.String("layout", "", "the OCI layout `add` wrote")
	repo := fs.String("repository", "", "where to push, e.g. ghcr.io/fluksio/fluksio-worker")
	digestFile := fs.String("digest-file", "", "write REPOSITORY@sha256:... here: the index by digest, which a deployment (the chart's image.digest) pins")
	var tags multi
	fs.Var(&tags, "tag", "a tag to push the index as (repeat for more; none: by digest only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *repo == "" {
		return errors.New("--layout and --repository are required")
	}
	idx, err := readIndex(*dir)
	if err != nil {
		return err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(m.Manifests) < 2 {
		return fmt.Errorf("%s holds %d platform(s); a release pushes all of them", *dir, len(m.Manifests))
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	// The index by its digest first (what pins it), then under each tag.
	byDigest, err := name.NewDigest(*repo + "@" + digest.String())
	if err != nil {
		return err
	}
	refs := []name.Reference{byDigest}
	for _, tag := range tags {
		ref, err := name.NewTag(*repo + ":" + tag)
		if err != nil {
			return err
		}
		refs = append(refs, ref)
	}
	for _, ref := range refs {
		// The keychain is Docker's: ~/.docker/config.json and its helpers
		// (`docker login`, or a CI's registry login action).
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		fmt.Printf("ociimage: pushed %s (%s)\n", ref, digest)
	}
	if *digestFile != "" {
		if err := os.WriteFile(*digestFile, []byte(byDigest.String()+"\n"), 0o644); err != nil {
			return fmt.Errorf("the pushed image's digest: %w", err)
		}
	}
	return nil
}
