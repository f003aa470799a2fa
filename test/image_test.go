package test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// imageLayout is where the release build writes the container image, an OCI
// layout under dist/ (see the post hook in .goreleaser.yaml).
const imageLayout = "fluksio-worker_oci"

// TestImage checks the image of a snapshot someone built by hand into the
// repository's dist/ (goreleaser release --snapshot --clean --skip=publish,sign).
// CI builds no dist/ there: TestPackages checks the image of the snapshot it
// builds anyway (TestPackages/image), so the release is built once.
func TestImage(t *testing.T) {
	dist := filepath.Join(moduleRoot(t), "dist")
	if _, err := os.Stat(filepath.Join(dist, imageLayout, "index.json")); err != nil {
		t.Skipf("no image in %s (%v); run `goreleaser release --snapshot --clean --skip=publish,sign` to check one here; "+
			"TestPackages/image checks the one its own snapshot build makes", dist, err)
	}
	checkImage(t, dist, "")
}

// checkImage opens the OCI layout in dist: one index, tagged with the
// version, of linux/amd64 and linux/arm64 images whose one layer is the
// static binary at /fluksio-worker and nothing else. The binary for this
// machine is taken out and run: version, inventory, and copy (what the
// chart's init container runs) then the copy's version. version "" takes
// the layout's tag.
func checkImage(t *testing.T, dist, version string) {
	t.Helper()
	dir := filepath.Join(dist, imageLayout)
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("%s is not an OCI layout: %v", dir, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	topManifest, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(topManifest.Manifests) != 1 || topManifest.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json should name one OCI image index, names %+v", topManifest.Manifests)
	}
	tag := topManifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
	if version == "" {
		version = tag
	}
	if tag != version {
		t.Errorf("the layout tags the index %q, want the version %q", tag, version)
	}
	idx, err := top.ImageIndex(topManifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Every blob is there and matches its digest and size.
	if err := validate.Index(idx); err != nil {
		t.Fatalf("the image index does not validate: %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		if d.Platform == nil {
			t.Errorf("manifest %s has no platform", d.Digest)
			continue
		}
		platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("the index holds %v, want linux/amd64 and linux/arm64", platforms)
	}
	if got := m.Annotations["org.opencontainers.image.version"]; got != version {
		t.Errorf("index version annotation %q, want %q", got, version)
	}

	var here string
	for _, d := range m.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		plat := d.Platform.OS + "/" + d.Platform.Architecture
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != d.Platform.OS || cf.Architecture != d.Platform.Architecture {
			t.Errorf("%s: config says %s/%s", plat, cf.OS, cf.Architecture)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{"/fluksio-worker"}) {
			t.Errorf("%s: entrypoint %v, want [/fluksio-worker]", plat, cf.Config.Entrypoint)
		}
		if u := cf.Config.User; u == "" || u == "0" || strings.HasPrefix(u, "0:") || u == "root" {
			t.Errorf("%s: runs as %q, want a non-root user", plat, u)
		}
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		if len(layers) != 1 {
			t.Fatalf("%s: %d layers, want 1 (an empty base and the binary)", plat, len(layers))
		}
		bin := filepath.Join(t.TempDir(), "fluksio-worker")
		extractOnly(t, plat, layers[0], "fluksio-worker", bin)
		checkStaticELF(t, bin, d.Platform.Architecture)
		if d.Platform.OS == runtime.GOOS && d.Platform.Architecture == runtime.GOARCH {
			here = bin
		}
	}
	if here == "" {
		t.Skipf("the image has no %s/%s binary to run here", runtime.GOOS, runtime.GOARCH)
	}

	out, err := exec.Command(here, "version").CombinedOutput()
	if got, _, _ := strings.Cut(string(out), "\n"); err != nil || got != "fluksio-worker "+version {
		t.Errorf("image's fluksio-worker version = %q, %v; want %q", got, err, "fluksio-worker "+version)
	}
	out, err = exec.Command(here, "inventory", "--python", fakeRunnerPath(t), "--labels", "gpu").Output()
	var hello struct {
		Labels    []string       `json:"labels"`
		Inventory map[string]any `json:"inventory"`
	}
	if err != nil || json.Unmarshal(out, &hello) != nil || !slices.Equal(hello.Labels, []string{"gpu"}) || hello.Inventory["cpus"] == nil {
		t.Errorf("image's fluksio-worker inventory: %v\n%s", err, out)
	}
	// What the chart's init container does, then the main container.
	shared := t.TempDir() // the shared volume's mount point
	if out, err := exec.Command(here, "copy", shared).CombinedOutput(); err != nil {
		t.Fatalf("fluksio-worker copy: %v\n%s", err, out)
	}
	st, err := os.Stat(filepath.Join(shared, "fluksio-worker"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("the copy: %v, mode %v; want 0755", err, st)
	}
	out, err = exec.Command(filepath.Join(shared, "fluksio-worker"), "version").CombinedOutput()
	if got, _, _ := strings.Cut(string(out), "\n"); err != nil || got != "fluksio-worker "+version {
		t.Errorf("the copied binary's version = %q, %v", got, err)
	}
}

// extractOnly checks that the layer holds exactly one file, name, a regular
// file of mode 0755 owned by root, and writes it to dst.
func extractOnly(t *testing.T, plat string, layer v1.Layer, name, dst string) {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: layer: %v", plat, err)
		}
		if strings.TrimPrefix(h.Name, "./") != name {
			t.Errorf("%s: the layer holds %s; only %s belongs there", plat, h.Name, name)
			continue
		}
		if h.Typeflag != tar.TypeReg || h.Mode&0o777 != 0o755 || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: %s is type %c mode %o owner %d:%d; want a 0755 file owned by root", plat, name, h.Typeflag, h.Mode, h.Uid, h.Gid)
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		found = true
	}
	if !found {
		t.Fatalf("%s: the layer has no %s", plat, name)
	}
}

// TestImageBuildAndPush runs packaging/ociimage as the release does, without
// GoReleaser: `add` for both platforms at once (the build hooks run in
// parallel; a lock serializes them), then `push` to a registry (an
// in-process one) with two tags; what the registry serves is the layout's
// index, byte for byte.
func TestImageBuildAndPush(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles packaging/ociimage; skipped with -short")
	}
	root := moduleRoot(t)
	tool := filepath.Join(t.TempDir(), "ociimage")
	runTool(t, root, []string{"CGO_ENABLED=0"}, "go", "build", "-o", tool, "./packaging/ociimage")
	dist := t.TempDir()
	dir := filepath.Join(dist, imageLayout)
	errs := make(chan error, 3)
	for _, arch := range []string{"amd64", "arm64", "none"} {
		goos := "linux"
		if arch == "none" {
			goos, arch = "darwin", "arm64" // not in the image: ignored
		}
		go func() {
			out, err := exec.Command(tool, "add", "--layout", dir, "--binary", workerBinary(t), "--os", goos, "--arch", arch,
				"--version", "9.9.9", "--created", "1700000000").CombinedOutput()
			if err != nil {
				err = fmt.Errorf("add %s/%s: %v\n%s", goos, arch, err, out)
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := p.ImageIndex()
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 2 {
		t.Fatalf("two concurrent adds left %d platforms (%v)", len(m.Manifests), err)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	repo := strings.TrimPrefix(srv.URL, "http://") + "/fluksio/fluksio-worker"
	runTool(t, root, nil, tool, "push", "--layout", dir, "--repository", repo, "--tag", "9.9.9", "--tag", "latest")
	want, _ := idx.Digest()
	for _, tag := range []string{"9.9.9", "latest"} {
		ref, err := name.NewTag(repo + ":" + tag)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Index(ref)
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s is %s, the layout's index is %s", ref, d, want)
		}
		if err := validate.Index(got); err != nil {
			t.Errorf("%s does not validate: %v", ref, err)
		}
	}
}

// TestCopyCommand: what the chart's init container runs. The binary copies
// itself, byte for byte and executable, into a directory (made if missing,
// a previous copy replaced); `copy --help` is help on stdout, exit 0.
func TestCopyCommand(t *testing.T) {
	t.Parallel()
	// A mount path with a typo: nothing is created, and it fails.
	missing := filepath.Join(t.TempDir(), "shared", "bin")
	if w := startBinary(t, nil, "copy", missing); w.wait(10*time.Second) != 1 || !strings.Contains(w.logs.String(), "does not exist") {
		t.Errorf("copy into a missing directory: %s", w.logs.String())
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("copy created %s", missing)
	}
	dir := t.TempDir() // the shared volume's mount point
	for range 2 {
		w := startBinary(t, nil, "copy", dir)
		if code := w.wait(10 * time.Second); code != 0 {
			t.Fatalf("copy: exit %d: %s", code, w.logs.String())
		}
	}
	want, _ := os.ReadFile(workerBinary(t))
	got, err := os.ReadFile(filepath.Join(dir, "fluksio-worker"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy differs from the binary (%v)", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "fluksio-worker")); st.Mode().Perm() != 0o755 {
		t.Errorf("the copy's mode is %v, want 0755", st.Mode())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want only the binary", len(entries))
	}
	out, err := exec.Command(workerBinary(t), "copy", "--help").Output()
	if err != nil || !strings.HasPrefix(string(out), "Usage: fluksio-worker copy DIR") {
		t.Errorf("copy --help: %v, %q", err, out)
	}
	if w := startBinary(t, nil, "copy"); w.wait(10*time.Second) != 2 {
		t.Error("copy without a directory should exit 2")
	}
}
