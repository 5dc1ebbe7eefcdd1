//! `flodl-rank`: a real flodl 0.8 training program, written as a flodl user
//! writes one, for cohort's interop runs with real ranks.
//!
//! An MLP classifier (`features -> hidden -> ReLU -> classes`, a flodl
//! `FlowBuilder` graph) trains with SGD and cross-entropy on a synthetic
//! data set the program builds itself (Gaussian blobs, one per class, from
//! a fixed seed: every process builds the same samples) through
//! `Trainer::builder(..)` on flodl's CPU averaging plane
//! (`ElCheConfig::cpu_sync()`, i.e. `ApplyPolicy::Sync` + `AverageBackend::Cpu`),
//! or with `--backend nccl` on its NCCL plane (`ElCheConfig::nccl_sync()`),
//! which needs CUDA devices: on a CPU-only machine it shows how far flodl's
//! NCCL rank path gets.
//!
//! Run by a worker agent (flodl's or `cohort agent -- ...`), the process is
//! one rank of the cluster: flodl reads the envelope from the environment,
//! and `Trainer::builder(..).run()` trains under the controller's plans
//! until `Shutdown`. Without an envelope it trains alone on the CPU, which
//! checks the libtorch build without a cluster.
//!
//! The coordinator's plan must cover this program's data set: give the
//! controller the same sample count and batch size (`--samples`,
//! `--batch-size`).
//!
//! stdout carries one JSON object per line (the agent may prefix each line
//! with the rank's label):
//!
//! - `{"event":"start", "rank", "world_size", "device", "params", "samples", "initial_loss", "initial_accuracy"}`
//!   from every rank, before training (the initial model on the whole data
//!   set; every rank builds the same one);
//! - `{"event":"epoch", "rank", "epoch", "loss", "accuracy"}` from the rank
//!   the controller elects for epoch callbacks, when epoch `epoch + 1`
//!   starts: the whole data set's loss under the averaged model that
//!   epoch `epoch` ended with;
//! - `{"event":"checkpoint", "rank", "version", "path", "reloaded_loss"}`
//!   after each checkpoint the controller asks for (`--checkpoint-dir`),
//!   read back into a fresh model to prove it loads;
//! - `{"event":"final", "rank", "epochs", "batches", "train_loss_first", "train_loss_last", "loss", "accuracy"}`
//!   from every rank after `Shutdown`: the final averaged model on the
//!   whole data set, and this rank's mean batch loss over its first and
//!   last tenth of batches.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

mod blobs;

use blobs::{BlobSpec, Blobs};
use flodl::{
    BatchDataSet, Device, ElCheConfig, FlowBuilder, Graph, Linear, Module, ReLU, Result, SGD, Tensor,
    TensorError, Trainer, Variable, cross_entropy_loss, manual_seed, no_grad,
};

/// The program's knobs.
#[derive(Debug, Clone)]
struct Opts {
    samples: usize,
    features: usize,
    classes: usize,
    hidden: usize,
    batch_size: usize,
    epochs: usize,
    lr: f64,
    momentum: f64,
    /// Seed of the data set and of the initial model.
    seed: u64,
    checkpoint_every: Option<usize>,
    checkpoint_dir: Option<PathBuf>,
    /// Average over NCCL (`ElCheConfig::nccl_sync()`) instead of the CPU plane.
    nccl: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            samples: 4000,
            features: 8,
            classes: 3,
            hidden: 32,
            batch_size: 32,
            epochs: 4,
            lr: 0.05,
            momentum: 0.9,
            seed: 7,
            checkpoint_every: None,
            checkpoint_dir: None,
            nccl: false,
        }
    }
}

const USAGE: &str = "usage: flodl-rank [--samples N] [--features N] [--classes N] [--hidden N] \
[--batch-size N] [--epochs N] [--lr X] [--momentum X] [--seed N] [--checkpoint-every N] [--checkpoint-dir DIR] \
[--backend cpu|nccl]";

impl Opts {
    fn blobs(&self) -> BlobSpec {
        BlobSpec { samples: self.samples, features: self.features, classes: self.classes, seed: self.seed }
    }
}

fn parse(args: &[String]) -> std::result::Result<Opts, String> {
    fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> std::result::Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag} {v:?}: not a valid value"))
    }
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--samples" => o.samples = num(a, it.next())?,
            "--features" => o.features = num(a, it.next())?,
            "--classes" => o.classes = num(a, it.next())?,
            "--hidden" => o.hidden = num(a, it.next())?,
            "--batch-size" => o.batch_size = num(a, it.next())?,
            "--epochs" => o.epochs = num(a, it.next())?,
            "--lr" => o.lr = num(a, it.next())?,
            "--momentum" => o.momentum = num(a, it.next())?,
            "--seed" => o.seed = num(a, it.next())?,
            "--checkpoint-every" => o.checkpoint_every = Some(num(a, it.next())?),
            "--checkpoint-dir" => o.checkpoint_dir = Some(PathBuf::from(num::<String>(a, it.next())?)),
            "--backend" => {
                o.nccl = match num::<String>(a, it.next())?.as_str() {
                    "cpu" => false,
                    "nccl" => true,
                    other => return Err(format!("--backend {other:?}: cpu or nccl")),
                }
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if o.samples == 0
        || o.features == 0
        || o.classes < 2
        || o.hidden == 0
        || o.batch_size == 0
        || o.epochs == 0
    {
        return Err("--samples, --features, --hidden, --batch-size and --epochs must be above 0, --classes at least 2".into());
    }
    if !(o.lr > 0.0 && o.lr.is_finite() && (0.0..1.0).contains(&o.momentum)) {
        return Err("--lr must be a positive number, --momentum in [0, 1)".into());
    }
    if o.checkpoint_every == Some(0) {
        return Err("--checkpoint-every must be above 0".into());
    }
    Ok(o)
}

impl Blobs {
    fn tensors(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let mut x = Vec::with_capacity(indices.len() * self.features);
        let mut y = Vec::with_capacity(indices.len());
        for &i in indices {
            let row = self.x.get(i * self.features..(i + 1) * self.features).ok_or_else(|| {
                TensorError::new(&format!("sample {i} is outside the data set of {}", self.y.len()))
            })?;
            x.extend_from_slice(row);
            y.push(self.y[i]);
        }
        let n = indices.len() as i64;
        Ok(vec![
            Tensor::from_f32(&x, &[n, self.features as i64], Device::CPU)?,
            Tensor::from_i64(&y, &[n], Device::CPU)?,
        ])
    }
}

impl BatchDataSet for Blobs {
    fn len(&self) -> usize {
        self.y.len()
    }

    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        self.tensors(indices)
    }
}

/// The model, on `device`, from the seed (so every rank starts alike).
fn mlp(o: &Opts, device: Device) -> Result<Graph> {
    manual_seed(o.seed);
    FlowBuilder::from(Linear::on_device(o.features as i64, o.hidden as i64, device)?)
        .through(ReLU::new())
        .through(Linear::on_device(o.hidden as i64, o.classes as i64, device)?)
        .build()
}

/// One batch's loss: cross-entropy of the logits against the labels.
fn batch_loss(model: &Graph, batch: &[Tensor]) -> Result<Variable> {
    let [x, y] = batch else {
        return Err(TensorError::new("a batch is [features, labels]"));
    };
    let logits = model.forward(&Variable::new(x.clone(), false))?;
    cross_entropy_loss(&logits, &Variable::new(y.clone(), false))
}

/// The whole data set's mean loss and accuracy under `model`.
fn evaluate(model: &Graph, data: &Blobs) -> Result<(f64, f64)> {
    let all: Vec<usize> = (0..data.len()).collect();
    let batch = data.tensors(&all)?;
    no_grad(|| {
        let logits = model.forward(&Variable::new(batch[0].clone(), false))?;
        let loss = cross_entropy_loss(&logits, &Variable::new(batch[1].clone(), false))?.item()?;
        let predicted = logits.data().argmax(1, false)?.to_i64_vec()?;
        let right = predicted.iter().zip(&data.y).filter(|(p, y)| p == y).count();
        Ok((loss, right as f64 / data.len() as f64))
    })
}

/// A model holding `params` (in `parameters()` order).
fn model_with(o: &Opts, params: &[Tensor]) -> Result<Graph> {
    let model = mlp(o, Device::CPU)?;
    let mine = model.parameters();
    if mine.len() != params.len() {
        return Err(TensorError::new(&format!(
            "{} trained tensors for a model of {} parameters",
            params.len(),
            mine.len()
        )));
    }
    no_grad(|| -> Result<()> {
        for (p, t) in mine.iter().zip(params) {
            p.variable.data().copy_(t, false)?;
        }
        Ok(())
    })?;
    Ok(model)
}

/// Writes one JSON line to stdout.
fn emit(v: serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// This process's rank and world, from the envelope (`None`: no cluster).
fn cluster_rank() -> Option<(usize, usize, String)> {
    let cluster = flodl::distributed::cluster::LocalCluster::from_env().ok()??;
    let (rank, device) = cluster.my_rank().ok()?;
    Some((rank, cluster.world_size(), format!("{device:?}")))
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

fn run(o: Opts) -> Result<()> {
    let data = Arc::new(Blobs::new(&o.blobs()));
    let (rank, world_size, device) = cluster_rank().unwrap_or((0, 1, "Cpu".to_string()));
    let probe = mlp(&o, Device::CPU)?;
    let params: usize = probe.parameters().iter().map(|p| p.variable.data().numel() as usize).sum();
    // What flodl's model signature hashes (names, dtypes, shapes in
    // `parameters()` order): a cohort rank training this model in the same
    // world must present the same signature.
    let manifest: Vec<serde_json::Value> = probe
        .parameters()
        .iter()
        .map(|p| {
            let d = p.variable.data();
            serde_json::json!({ "name": p.name, "dtype": format!("{:?}", d.dtype()), "dtype_code": d.dtype() as i32, "shape": d.shape() })
        })
        .collect();
    let (l0, a0) = evaluate(&probe, &data)?;
    drop(probe);
    emit(serde_json::json!({
        "event": "start", "rank": rank, "world_size": world_size, "device": device,
        "params": params, "samples": data.len(), "initial_loss": l0, "initial_accuracy": a0,
        "manifest": manifest,
    }));

    // Every batch loss this rank computes, in order.
    let losses: Arc<Mutex<Vec<f64>>> = Arc::default();
    let factory_opts = o.clone();
    let train_losses = Arc::clone(&losses);
    let eval_data = Arc::clone(&data);
    let mut builder = Trainer::builder(
        move |device| mlp(&factory_opts, device),
        {
            let (lr, momentum) = (o.lr, o.momentum);
            move |params| SGD::new(params, lr, momentum)
        },
        move |model: &Graph, batch: &[Tensor]| {
            let loss = batch_loss(model, batch)?;
            let value = loss.item()?;
            train_losses.lock().unwrap_or_else(PoisonError::into_inner).push(value);
            Ok(loss)
        },
    )
    .dataset(Arc::clone(&data) as Arc<dyn BatchDataSet>)
    .batch_size(o.batch_size)
    .num_epochs(o.epochs)
    .elche(if o.nccl { ElCheConfig::nccl_sync() } else { ElCheConfig::cpu_sync() })
    .epoch_fn(move |epoch, worker| {
        if epoch == 0 {
            return;
        }
        match evaluate(worker.model(), &eval_data) {
            Ok((loss, accuracy)) => emit(serde_json::json!({
                "event": "epoch", "rank": worker.rank(), "epoch": epoch - 1,
                "loss": loss, "accuracy": accuracy,
            })),
            Err(e) => eprintln!("flodl-rank: evaluating before epoch {epoch}: {e}"),
        }
    });
    if let Some(every) = o.checkpoint_every {
        builder = builder.checkpoint_every(every);
    }
    if let Some(dir) = o.checkpoint_dir.clone() {
        std::fs::create_dir_all(&dir)
            .map_err(|e| TensorError::new(&format!("--checkpoint-dir {}: {e}", dir.display())))?;
        let reload_opts = o.clone();
        let reload_data = Arc::clone(&data);
        builder = builder.checkpoint_fn(move |version, model: &Graph| {
            let path = dir.join(format!("mlp-v{version}.fdl"));
            let path_str = path.to_string_lossy().into_owned();
            model.save_checkpoint(&path_str)?;
            // Read it back into a fresh model: a checkpoint that does not
            // load is no checkpoint.
            let fresh = mlp(&reload_opts, Device::CPU)?;
            fresh.load_checkpoint(&path_str)?;
            let (loss, _) = evaluate(&fresh, &reload_data)?;
            emit(serde_json::json!({
                "event": "checkpoint", "rank": rank, "version": version,
                "path": path_str, "reloaded_loss": loss,
            }));
            Ok(())
        });
    }

    let state = builder.run()?.join()?;
    let model = model_with(&o, &state.params)?;
    let (loss, accuracy) = evaluate(&model, &data)?;
    let losses = losses.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let tenth = (losses.len() / 10).max(1).min(losses.len());
    emit(serde_json::json!({
        "event": "final", "rank": rank, "epochs": o.epochs, "batches": losses.len(),
        "train_loss_first": mean(&losses[..tenth]), "train_loss_last": mean(&losses[losses.len() - tenth..]),
        "loss": loss, "accuracy": accuracy,
    }));
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("flodl-rank: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(opts) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flodl-rank: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn flags_parse_and_bad_values_are_refused() {
        let o = parse(&args("--samples 100 --batch-size 10 --checkpoint-every 2 --backend nccl")).unwrap();
        assert_eq!((o.samples, o.batch_size, o.checkpoint_every, o.nccl), (100, 10, Some(2), true));
        for bad in [
            "--samples 0",
            "--classes 1",
            "--lr 0",
            "--momentum 1",
            "--checkpoint-every 0",
            "--backend gpu",
            "--epochs",
            "--x 1",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_data_set_is_the_same_in_every_process_and_balanced() {
        let o = Opts { samples: 300, ..Opts::default() };
        let (a, b) = (Blobs::new(&o.blobs()), Blobs::new(&o.blobs()));
        assert_eq!(a.x, b.x);
        assert_eq!(a.y, b.y);
        assert_eq!(a.x.len(), 300 * o.features);
        for c in 0..3 {
            assert_eq!(a.y.iter().filter(|&&y| y == c).count(), 100);
        }
        assert!(Blobs::new(&Opts { seed: 8, ..o.clone() }.blobs()).x != a.x);
    }
}
