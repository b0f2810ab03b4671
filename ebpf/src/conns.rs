//! The window clamp's connection table (`an_conns`): each pod's share of it, its sweep, and
//! what the programs keep per pod (`an_pod_rt`). See `an_conns` in the ABI header.

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};

use crate::{abi, datapath::Datapath, error::DatapathError, maps, programs};

/// A frame for the sweep program to run on: it reads nothing of it.
const SWEEP_FRAME: [u8; 64] = [0; 64];

impl Datapath {
    /// Runs the sweep once: removes the entries whose pod is gone and those idle past their
    /// state's time to live, each given back to its pod's share. Returns how many went.
    pub fn sweep_conns(&self) -> Result<u32, DatapathError> {
        let name = programs::CONNS_SWEEP;
        let prog = SchedClassifier::from_pin(self.pins.prog(name))
            .map_err(|e| DatapathError::program(name, e))?;
        let res = prog
            .test_run(TestRunOptions {
                data_in: Some(&SWEEP_FRAME),
                ..TestRunOptions::new()
            })
            .map_err(|e| DatapathError::program(name, e))?;
        Ok(res.return_value)
    }

    /// Sets each pod's share of the table for `pods` attached pods
    /// ([`abi::conn_share`]): together they never hold more than the table, and a pod at its
    /// share learns no new connection rather than taking another pod's entries.
    pub fn set_conn_share(&mut self, pods: u32) -> Result<(), DatapathError> {
        let share = abi::conn_share(pods);
        let _lock = self.lock()?;
        let mut cfg = self.config()?;
        if cfg.conn_share == share {
            return Ok(());
        }
        cfg.conn_share = share;
        self.config
            .set(0, cfg, 0)
            .map_err(|e| DatapathError::map(maps::CONFIG, e))
    }

    /// What the programs keep of the pod in `slot`: its link-scoped IPv6 budget and its
    /// connections in the table (held, refused, learnt again).
    pub fn pod_rt(&self, slot: u32) -> Result<abi::PodRt, DatapathError> {
        self.pod_rt
            .get(&slot, 0)
            .map_err(|e| DatapathError::map(maps::POD_RT, e))
    }
}
