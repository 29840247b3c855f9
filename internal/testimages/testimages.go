// Package testimages builds the container images Skiff's tests run and serves them from an in-process
// registry on the loopback interface, since no public registry is reachable where the tests run.
//
// The images (pushed by Push as <registry>/skiff/NAME:test):
//
//   - busybox: the host's /bin/busybox (Debian's busybox-static) with a symlink in /bin for each applet, /tmp,
//     /root, and an /etc/passwd and /etc/group with root and nobody (65534). Cmd ["sh"], PATH
//     /bin:/usr/bin:/sbin:/usr/sbin.
//   - server: the busybox image's files plus the test HTTP server (./testserver) at /server, the entrypoint. The
//     busybox applets make exec probes such as `cat /tmp/healthy` work in it.
//   - pause: the pod sandbox image of internal/images.PauseImage, with cmd/skiff-pause.
//   - extserver and operator (WriteProgramTarball): an extension API server (./extserver) and a
//     controller-runtime operator (./operator), each alone in its image.
package testimages

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/skiff-dev/skiff/internal/images"
)

// StartRegistry starts an in-memory OCI registry (go-containerregistry's pkg/registry) on 127.0.0.1, served
// over plain HTTP, and returns its address ("127.0.0.1:PORT"). It stops when the test ends.
func StartRegistry(t testing.TB) (addr string) {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// Images are the references of the pushed test images.
type Images struct {
	Busybox, Server, Pause string
}

// Push builds the test images (once per test process) and pushes them to the registry at registryAddr, such
// as one StartRegistry started. It fails the test if /bin/busybox is missing: setup installs busybox-static.
func Push(t testing.TB, registryAddr string) Images {
	t.Helper()
	b := build()
	if b.err != nil {
		t.Fatalf("testimages: %v", b.err)
	}
	refs := Images{
		Busybox: registryAddr + "/skiff/busybox:test",
		Server:  registryAddr + "/skiff/server:test",
		Pause:   registryAddr + "/skiff/pause:test",
	}
	pushes := map[string]v1.Image{refs.Busybox: b.busybox, refs.Server: b.server, refs.Pause: b.pause}
	for ref, img := range pushes {
		if err := images.Push(t.Context(), img, ref); err != nil {
			t.Fatalf("testimages: %v", err)
		}
	}
	return refs
}

// built holds the images, built once per process: building takes a few seconds (two go builds and gzip), and
// many tests push the same images. A v1.Image is immutable, so tests may share them.
type built struct {
	busybox, server, pause v1.Image
	serverBinary           []byte // the test server, which the tests of this package also run on the host
	pauseBinary            []byte
	err                    error
}

var build = sync.OnceValue(func() (b built) {
	b.serverBinary, b.err = staticBinary("./internal/testimages/testserver")
	if b.err != nil {
		return b
	}
	b.pauseBinary, b.err = staticBinary("./cmd/skiff-pause")
	if b.err != nil {
		return b
	}
	spec, err := images.Busybox(images.BusyboxPath)
	if err != nil {
		b.err = err
		return b
	}
	base := spec.Files
	b.busybox, b.err = images.Build(spec)
	if b.err != nil {
		return b
	}
	server := append(base[:len(base):len(base)], images.File{Path: "/server", Mode: 0o755, Data: b.serverBinary})
	b.server, b.err = images.Build(images.Spec{Files: server, Env: []string{images.BusyboxPATH}, Entrypoint: []string{"/server"}})
	if b.err != nil {
		return b
	}
	b.pause, b.err = images.Build(images.PauseImage(b.pauseBinary))
	return b
})

// staticBinary builds the package pkg of this module and returns the binary. The file it builds into is
// removed at once, so that the process-wide cache leaves nothing behind.
func staticBinary(pkg string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "skiff-testimages-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "bin")
	if err := images.StaticBinary(context.Background(), pkg, out); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}

// WriteServerTarball writes the server image, named ref, as an image tarball at path, for agents that import
// images from their data dir (`skiff local up --images DIR`) instead of pulling them.
func WriteServerTarball(ref, path string) error {
	b := build()
	if b.err != nil {
		return b.err
	}
	return images.WriteTarball(b.server, ref, path)
}

// Programs of this package that run alone in an image, each at /NAME and the image's entrypoint.
const (
	// ExtensionServer is an extension API server (./extserver) for APIService tests.
	ExtensionServer = "extserver"
	// Operator is a controller-runtime operator (./operator) that reconciles Greetings into ConfigMaps.
	Operator = "operator"
)

// programImages builds each program's image once per process, and only for the tests that ask for it: the
// programs link k8s.io libraries and take a while to build.
var programImages = map[string]func() (v1.Image, error){
	ExtensionServer: sync.OnceValues(func() (v1.Image, error) { return programImage(ExtensionServer) }),
	Operator:        sync.OnceValues(func() (v1.Image, error) { return programImage(Operator) }),
}

func programImage(name string) (v1.Image, error) {
	bin, err := staticBinary("./internal/testimages/" + name)
	if err != nil {
		return nil, err
	}
	return images.Build(images.Spec{Files: []images.File{{Path: "/" + name, Mode: 0o755, Data: bin}}, Entrypoint: []string{"/" + name}})
}

// WriteProgramTarball writes the image of program (ExtensionServer or Operator), named ref, as an image
// tarball at path, for agents that import images from their data dir (`skiff local up --images DIR`).
func WriteProgramTarball(program, ref, path string) error {
	build, ok := programImages[program]
	if !ok {
		return fmt.Errorf("testimages: no program %q", program)
	}
	img, err := build()
	if err != nil {
		return err
	}
	return images.WriteTarball(img, ref, path)
}
