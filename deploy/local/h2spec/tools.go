//go:build tools

// Package tools pins h2spec and its dependencies (go.mod, go.sum) for
// deploy/local/k8s.sh, which builds github.com/summerwind/h2spec/cmd/h2spec from here.
package tools

import (
	_ "github.com/spf13/cobra"
	_ "github.com/summerwind/h2spec"
)
