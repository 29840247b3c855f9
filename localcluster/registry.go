package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/skiff-dev/skiff/internal/images"
)

// The cluster's registry. With `--images DIR`, `skiff local up` also starts a registry (the host "registry",
// a namespace of its own on the cluster's bridge) that serves every image of DIR's docker-archive tarballs
// under the name it has there, and the agents use it as the first mirror of each registry those names
// point at (registry.k8s.io, docker.io...), before the registry itself. Images the agents imported at start
// run offline; with the registry they can also be pulled again (imagePullPolicy: Always, image volumes).

// registryPort is where the cluster's registry listens, on its host's address.
const registryPort = 5000

// RegistryReadyFile is written by the registry once every image is in it.
func RegistryReadyFile(dir string) string { return dir + "/registry.ready" }

// tarballTags lists the image names a docker-archive tarball holds (none for an OCI layout tarball).
func tarballTags(path string) ([]string, error) {
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return nil, nil // not a docker archive: the agents import it, the registry does not serve it
	}
	var tags []string
	for _, d := range manifest {
		tags = append(tags, d.RepoTags...)
	}
	return tags, nil
}

// mirroredRegistries are the registry hosts, as the agents name them (docker.io for Docker Hub), that the
// tarballs' images are named after.
func mirroredRegistries(tarballs []string) ([]string, error) {
	seen := map[string]bool{}
	for _, path := range tarballs {
		tags, err := tarballTags(path)
		if err != nil {
			return nil, err
		}
		for _, t := range tags {
			ref, err := name.ParseReference(t)
			if err != nil {
				return nil, fmt.Errorf("%s: image name %q: %w", path, t, err)
			}
			host := ref.Context().RegistryStr()
			if host == name.DefaultRegistry {
				host = "docker.io"
			}
			seen[host] = true
		}
	}
	var hosts []string
	for h := range seen {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	return hosts, nil
}

// ServeRegistry is `skiff local registry`: an in-memory registry on listen holding the images of the
// tarballs in imagesDir, each under its repository path without the registry host ("e2e-test-images/
// agnhost:2.66.1" for registry.k8s.io/e2e-test-images/agnhost:2.66.1). It writes ready once every image is
// in, and serves until ctx ends.
func ServeRegistry(ctx context.Context, imagesDir, listen, ready string) error {
	tarballs, err := imageTarballs(imagesDir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer srv.Close()
	repos := map[string]string{} // repository path → the image name it came from, to refuse two under one path
	for _, path := range tarballs {
		tags, err := tarballTags(path)
		if err != nil {
			return err
		}
		for _, t := range tags {
			src, err := name.NewTag(t)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			repoPath := src.RepositoryStr() + ":" + src.TagStr()
			if prev, ok := repos[repoPath]; ok && prev != t {
				return fmt.Errorf("%s and %s would both be %s in the cluster's registry", prev, t, repoPath)
			}
			repos[repoPath] = t
			img, err := tarball.ImageFromPath(path, &src)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", path, t, err)
			}
			if err := images.Push(ctx, img, listen+"/"+repoPath); err != nil {
				return fmt.Errorf("pushing %s: %w", t, err)
			}
		}
	}
	if err := os.WriteFile(ready, []byte(strings.Join(sortedKeys(repos), "\n")+"\n"), 0o600); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

func sortedKeys(m map[string]string) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
